import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread_for_every_bench_test(one_thread):
    yield
