"""What every family's quirks file shares: its tiny checkpoint, fp32 transformers model and oracle,
each the session's (registry.Tiny), found by the module's FAMILY (its model_type), and an engine of
that checkpoint."""
import pytest

from pope_fast.engine import Engine, Settings


@pytest.fixture(scope="module")
def checkpoint(tiny, request):
    return tiny.checkpoint(request.module.FAMILY)


@pytest.fixture(scope="module")
def model(tiny, request):
    return tiny.model(request.module.FAMILY)


@pytest.fixture(scope="module")
def oracle(tiny, request):
    return tiny.oracle(request.module.FAMILY)


@pytest.fixture
def engine(checkpoint):
    """A fresh engine of that checkpoint at the default settings, its readouts the template's."""
    return Engine.load(checkpoint, Settings(), readouts="template_aware")
