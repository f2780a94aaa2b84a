"""What every family's quirks file shares: its tiny checkpoint, fp32 transformers model and oracle, each the session's
(registry.Tiny), found by the module's FAMILY (its model_type)."""
import pytest


@pytest.fixture(scope="module")
def checkpoint(tiny, request):
    return tiny.checkpoint(request.module.FAMILY)


@pytest.fixture(scope="module")
def model(tiny, request):
    return tiny.model(request.module.FAMILY)


@pytest.fixture(scope="module")
def oracle(tiny, request):
    return tiny.oracle(request.module.FAMILY)
