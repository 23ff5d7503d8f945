"""SWIM membership with Lifeguard: the pure machine, its wire messages, the simulator."""
