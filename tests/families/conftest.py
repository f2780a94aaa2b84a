"""The families' tiny checkpoints, transformers models and oracles, each made once a session (registry.Tiny), for
test_battery (through `family`, parametrized indirectly over the registry) and the family files (by name)."""
import pytest
from registry import REGISTRY, Tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Tiny:
    return Tiny(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="session")
def family(request):
    return REGISTRY[request.param]


@pytest.fixture(scope="session")
def family_checkpoint(family, tiny):
    return tiny.checkpoint(family.name)


@pytest.fixture(scope="session")
def family_oracle(family, tiny):
    return tiny.oracle(family.name)
