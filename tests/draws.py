"""Examples a Hypothesis strategy draws, as the kit's searches draw them (derandomized)."""
from hypothesis import HealthCheck, given, settings


def draw_examples(strategy, n: int) -> list:
    """The first ``n`` examples ``strategy`` generates (derandomized, no database)."""
    out = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(x=strategy)
    def collect(x):
        out.append(x)
    collect()
    return out
