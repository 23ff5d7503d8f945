"""The public names of corral.registry."""

from __future__ import annotations

import corral.registry


def test_all_lists_the_public_names() -> None:
    assert corral.registry.__all__ == [
        "ALIAS_PREFIX",
        "APPS_PREFIX",
        "ARTIFACTS_PREFIX",
        "ASSIGN_PREFIX",
        "COORDINATOR_LEASE_KEY",
        "DOMAIN_PREFIX",
        "DOWN_PREFIX",
        "INTENT_PREFIX",
        "MAX_LABELS",
        "NODES_PREFIX",
        "PLACEMENT_PREFIX",
        "PORTS_PREFIX",
        "ROUTING_KEY",
        "SECRET_FINGERPRINT_KEY",
        "AliasRecord",
        "AppRecord",
        "Artifact",
        "Capacity",
        "Compare",
        "CompareOp",
        "CompareTarget",
        "CoordinatorLease",
        "Delete",
        "Deployment",
        "DomainClaim",
        "EtcdRegistry",
        "EventType",
        "Get",
        "InvalidKey",
        "InvalidName",
        "InvalidRegistryUrl",
        "InvalidTxn",
        "KeyKind",
        "KeyValue",
        "Lease",
        "LeaseNotFound",
        "MemoryRegistry",
        "NodeAssignment",
        "NodeDown",
        "NodeIntent",
        "NodeRecord",
        "PlacementRecord",
        "PortClaim",
        "Put",
        "Record",
        "Registry",
        "RegistryAuthError",
        "RegistryError",
        "RegistryOptions",
        "RegistryReplaced",
        "RegistryUnavailable",
        "RegistryUrl",
        "RevisionCompacted",
        "RoutingTable",
        "SQLiteRegistry",
        "SecretFingerprint",
        "ServingEntry",
        "TxnOp",
        "TxnResult",
        "Undecodable",
        "WatchEvent",
        "alias_key",
        "alias_previous_key",
        "app_key",
        "artifact_key",
        "assign_key",
        "decode_record",
        "default_registry_url",
        "domain_key",
        "down_key",
        "intent_key",
        "is_valid_key",
        "node_key",
        "node_ports_prefix",
        "open_registry",
        "parse_key",
        "parse_registry_url",
        "placement_key",
        "port_key",
        "read_records",
        "validate_digest",
        "validate_domain",
        "validate_label",
        "validate_labels",
        "validate_name",
    ]
    for name in corral.registry.__all__:
        assert hasattr(corral.registry, name), name


def test_every_error_is_a_registry_error() -> None:
    from corral._errors import CorralError

    for name in (
        "RegistryUnavailable",
        "LeaseNotFound",
        "RevisionCompacted",
        "InvalidKey",
        "InvalidName",
        "InvalidTxn",
        "InvalidRegistryUrl",
    ):
        error = getattr(corral.registry, name)
        assert issubclass(error, corral.registry.RegistryError)
        assert issubclass(error, CorralError)
