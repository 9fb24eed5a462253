"""The multi-host bed (tests/support/netbed.py), one per test module."""

from __future__ import annotations

import pytest

from tests.support.netbed import Bed, cannot_build


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    """Two hosts built from network namespaces, removed after the module's tests."""
    why = cannot_build()
    if why:
        pytest.fail(f"cannot build the multi-host bed: {why}", pytrace=False)
    bed = Bed(tmp_path_factory.mktemp("bed"))
    try:
        bed.build()
    except (RuntimeError, OSError) as err:
        bed.close()
        pytest.fail(f"cannot build the multi-host bed's namespaces as root: {err}",
                    pytrace=False)
    yield bed
    bed.close()
