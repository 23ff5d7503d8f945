from corral.node import main

main()
