"""Rows reach stdout as they finish, in configuration order whatever order they finish in, and
a sweep's progress counts only the configurations it will simulate."""

from simsp.api import build_configs
from simsp.explore.evaluation.cache import ResultCache
from simsp.explore.evaluation.executor import Executor
from simsp.explore.evaluation.runner import evaluate_all
from simsp.explore.evaluation.stream import RowStream

LISTS = {"mode": "meta", "num_layers": "2", "micro_batch_size": "1,2,4"}


def test_a_row_is_printed_once_it_and_every_row_before_it_are_done(capsys):
    configs = build_configs(None, LISTS)
    digests = [c.digest() for c in configs]
    rows = evaluate_all(configs, Executor(workers=0), ResultCache(None))
    stream = RowStream(list(enumerate(configs)), configs[0], 0.0)
    found = {d: None for d in digests}
    found[digests[2]] = rows[digests[2]]  # the last finishes first: nothing yet
    stream(found)
    assert capsys.readouterr().out == ""
    found[digests[0]] = rows[digests[0]]
    stream(found)
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["0"]
    found[digests[1]] = rows[digests[1]]
    stream(found)
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["1", "2"]
    assert "--micro-batch-size 4" in out[1] and "tokens/s" in out[1]


class Bar:
    """What evaluate_all uses of a tqdm bar."""

    def __init__(self, total):
        self.total, self.n, self.failed = total, 0, 0

    def set_postfix(self, **kwargs):
        pass

    def update(self, count):
        self.n += count


def test_the_sweep_bar_counts_only_what_it_simulates(tmp_path):
    configs = build_configs(None, {**LISTS, "tensor_model_parallel_size": "1,3"})
    cache = ResultCache(tmp_path)
    evaluate_all(configs[:2], Executor(workers=0), cache)  # two rows cached
    bar = Bar(None)
    evaluate_all(configs, Executor(workers=0), cache, bar)
    # 6 configurations, 2 reused: the bar counts the other 4 (the t = 3 ones fail in evaluation)
    assert (bar.total, bar.n) == (4, 4) and cache.stats.simulated == 2 + 4
