"""search simulates the same layouts, prunes the same count and writes the same rows whatever
the executor and however many workers it has (its rounds do not depend on the parallelism)."""

from simsp.explore.evaluation.cache import ResultCache
from simsp.explore.configs.grid import base_values
from simsp.explore.evaluation.executor import Executor
from simsp.explore.configs.fields import by_key
from simsp.explore.search.branch_and_bound import search


def base() -> dict:
    values = base_values(None)
    table = by_key()
    for key, value in {"num_layers": 4, "hidden_size": 128, "seq_length": 64,
                       "vocab_size": 256, "mode": "meta"}.items():
        values[table[key].path] = value
    return values


class Wide(Executor):
    """In-process, but claiming the parallelism of a large cluster."""

    def __init__(self, parallelism: int):
        super().__init__(workers=0)
        self._claimed = parallelism

    def parallelism(self) -> int:
        return self._claimed


def outcome(executor) -> tuple:
    with executor:
        found = search(base(), 8, 8, executor, ResultCache(None), top=2)  # 542 pruned
    return found.pruned_bound, found.pruned_memory, [row["variant"] for row in found.rows], \
        [row["iteration_time_s"] for row in found.rows]


def test_search_is_the_same_whatever_the_parallelism():
    one = outcome(Executor(workers=0))
    assert one[0] > 0  # the bound pruned something: the rounds matter
    assert outcome(Wide(2)) == one and outcome(Wide(64)) == one
