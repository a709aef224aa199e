"""Starting from your own configuration: a pasted Megatron-LM launch line (--megatron-args,
--megatron-args-file), a Hugging Face config.json (--hf-config), "did you mean" for unknown
flags, and bare `simsp` (README "Start from your own launch line")."""

from dataclasses import replace
import json
import os
from pathlib import Path

import pytest

from inprocess import cli

from simsp.cli import COMMANDS
from simsp.scenario.flags import Parser, add_scenario_arguments
from simsp.scenario.outside import scenario_from_args
from simsp.scenario.loading import load_scenario

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
GPT3_LINE = FIXTURES / "megatron" / "gpt3_175b_launch.sh"


def scenario_of(argv: list[str]):
    """The Scenario `simsp run ARGV` would simulate (the same parser and loading)."""
    parser = Parser(prog="t")
    add_scenario_arguments(parser)
    return scenario_from_args(parser.parse_args(argv))


def assert_one_error(rc, out, err, *words):
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)


# --- the launch line of Megatron-LM's GPT-3 175B example --------------------------------------

# the fixture's flags by hand, as megatron/training/arguments.py @93da800 groups them
TRAINING_ONLY = ("--master_addr --master_port --train-iters --weight-decay --adam-beta1 "
                 "--adam-beta2 --init-method-std --clip-grad --lr --lr-decay-style --min-lr "
                 "--lr-warmup-fraction --lr-decay-iters --data-path --vocab-file --merge-file "
                 "--split --log-interval --save-interval --eval-interval --save --load "
                 "--eval-iters --tensorboard-dir").split()
NOT_MODELLED = ["--max-position-embeddings", "--rampup-batch-size", "--fp16"]


def test_gpt3_175b_line_sets_the_model_and_layout(capsys):
    sc = scenario_of(["--megatron-args-file", str(GPT3_LINE), "--nodes", "16", "--mode", "meta"])
    m, p, c = sc.model, sc.parallel, sc.cluster
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (96, 12288, 96, 2048)
    assert m.attention_backend == "auto"  # --attention-backend auto: Megatron's value, a row
    assert (p.tensor_model_parallel_size, p.pipeline_model_parallel_size) == (8, 16)
    assert (p.micro_batch_size, p.global_batch_size) == (1, 1536)
    # torchrun --nproc_per_node 8, and --nodes 16 given to simsp overrides --nnodes 1:
    # world 128 = t 8 x p 16 x d, so d = 1
    assert (c.nodes, c.gpus_per_node, p.data_parallel_size) == (16, 8, 1)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: --megatron-args: ignored 27 flag(s)")
    training, rest = err.split("training-only ", 1)[1].split("; not modelled ", 1)
    assert training.split() == TRAINING_ONLY
    assert rest.split(";")[0].split() == NOT_MODELLED
    assert "read --attention-backend" not in err  # every AttnBackend value is a row now


def test_gpt3_175b_line_runs_in_meta_mode(capsys):
    rc, out, err = cli(["run", "--megatron-args-file", str(GPT3_LINE), "--nodes", "16",
                                "--global-batch-size", "32", "--mode", "meta", "--json", "--quiet"])
    assert rc == 0, err
    assert err.startswith("note: --megatron-args: ignored 27 flag(s)") and err.count("\n") == 1
    result = json.loads(out)
    assert result["oom"] is False and result["iteration_time_s"] > 0
    assert result["scenario"] == "gpt3_175b_launch"  # no scenario file: named after the line's
    assert result["architecture"].startswith("MHA 96, GeLU f = 49152")  # 4h, Megatron's default


def test_launcher_world_derives_data_parallel_and_names_itself():
    sc = scenario_of(["--megatron-args", "torchrun --nnodes=2 --nproc-per-node 8 train.py "
                      "--tensor-model-parallel-size 2 --num-attention-heads 4"])
    assert (sc.cluster.nodes, sc.parallel.data_parallel_size) == (2, 8)  # 16 GPUs / t 2


def test_launcher_world_that_does_not_fit_is_one_error(capsys):
    rc, out, err = cli(["run", "--megatron-args", "torchrun --nnodes 1 "
                                "--nproc_per_node 8 x.py --tensor-model-parallel-size 16"])
    assert_one_error(rc, out, err, "--megatron-args", "--nnodes 1 x --nproc_per_node 8")


def test_flags_given_directly_win_over_the_line():
    line = "pretrain_gpt.py --num-layers 12 --hidden-size 256 --num-attention-heads 8"
    sc = scenario_of(["--megatron-args", line, "--num-layers", "3"])
    assert (sc.model.num_layers, sc.model.hidden_size) == (3, 256)


def test_flags_only_line_without_a_script():
    sc = scenario_of(["--megatron-args", "--num-layers 5 --lr 1e-4"])
    assert sc.model.num_layers == 5


@pytest.mark.parametrize("line, words", [
    ("pretrain_gpt.py --num-layer 4", ["unknown flag --num-layer", "did you mean --num-layers?"]),
    ("pretrain_gpt.py --lr-decay-stile cosine", ["did you mean --lr-decay-style?"]),
    ("pretrain_gpt.py --num-layers four", ["--num-layers", "invalid int value"]),
    ("pretrain_gpt.py stray --num-layers 2", ["unexpected word 'stray'"]),
    ("torchrun --nnodes two x.py", ["--nnodes", "positive whole number"]),
    ("torchrun x", ["no training script"]),
    ("x.py --num-layers 'unclosed", ["cannot split into words"]),
])
def test_bad_lines_are_one_error(capsys, line, words):
    rc, out, err = cli(["run", "--megatron-args", line])
    assert_one_error(rc, out, err, "--megatron-args", *words)


def test_line_and_file_together_conflict(capsys):
    rc, out, err = cli(["run", "--megatron-args", "--num-layers 2",
                                "--megatron-args-file", str(GPT3_LINE)])
    assert_one_error(rc, out, err, "--megatron-args", "--megatron-args-file")


def test_unknown_flag_on_simsp_command_line_says_did_you_mean(capsys):
    rc, out, err = cli(["run", "--tensor-model-paralel-size", "2"])
    assert_one_error(rc, out, err, "--tensor-model-paralel-size",
                     "did you mean --tensor-model-parallel-size?")


# --- Hugging Face config.json -----------------------------------------------------------------

# what a config.json does not carry, from each bundled scenario's [model] section: the attention
# core simsp is asked to run, the sequence length trained on (not the longest position), the
# router's auxiliary loss and the MTP loss weight
NOT_IN_HF = {
    "llama3-8b": {"attention_backend": "flash"},  # seq_length 8192 = max_position_embeddings
    "mixtral-8x7b": {"attention_backend": "flash", "seq_length": 4096,
                     "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.01},
    "qwen3-30b-a3b": {"attention_backend": "flash", "seq_length": 4096,
                      "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.001},
    "deepseek-v3": {"attention_backend": "flash", "seq_length": 4096,
                    "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.0001,
                    "mtp_loss_scaling_factor": 0.1},
}


def _head_dim_filled(model):
    """The model with kv_channels written out (None means hidden / heads, config.py)."""
    return replace(model, kv_channels=model.kv_channels or model.hidden_size // model.num_attention_heads)


@pytest.mark.parametrize("name", sorted(NOT_IN_HF))
def test_hf_config_rebuilds_the_bundled_model_section(name):
    bundled = load_scenario(REPO / "scenarios" / f"{name}.toml").model
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in NOT_IN_HF[name].items()]
    rebuilt = scenario_of(["--hf-config", str(FIXTURES / "hf" / f"{name}.json"), *flags]).model
    assert _head_dim_filled(rebuilt) == _head_dim_filled(bundled)


def test_hf_sequence_length_only_where_not_given(tmp_path):
    config = str(FIXTURES / "hf" / "mixtral-8x7b.json")
    short = ["--num-layers", "2", "--num-experts", "2", "--mode", "meta"]
    assert scenario_of(["--hf-config", config, *short]).model.seq_length == 32768
    assert scenario_of(["--hf-config", config, *short, "--seq-length", "1024"]).model.seq_length == 1024
    toml = tmp_path / "s.toml"
    toml.write_text("[model]\nseq_length = 2048\n")
    assert scenario_of([str(toml), "--hf-config", config, *short]).model.seq_length == 2048


def test_qwen_moe_sparse_step_pattern(tmp_path):
    config = json.loads((FIXTURES / "hf" / "qwen3-30b-a3b.json").read_text())
    config.update(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    sc = scenario_of(["--hf-config", str(path), "--mode", "meta", "--seq-length", "128"])
    # layer i is sparse when (i + 1) % 2 == 0 and i is not in mlp_only_layers: only layer 1
    assert sc.model.moe_layer_freq == "[0,1,0,0]"


def test_deepseek_moe_every_other_layer(tmp_path):
    config = json.loads((FIXTURES / "hf" / "deepseek-v3.json").read_text())
    config.update(num_hidden_layers=6, first_k_dense_replace=1, moe_layer_freq=2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    sc = scenario_of(["--hf-config", str(path), "--mode", "meta", "--seq-length", "128"])
    # MoE where i >= 1 and i % 2 == 0: layers 2 and 4
    assert sc.model.moe_layer_freq == "[0,0,1,0,1,0]"


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", ["must be a JSON object"]),
    ("{", ["is not valid JSON"]),
    ("[" * 100000 + "]" * 100000, ["is not valid JSON"]),
    ('{"model_type": "gpt2"}', ["model_type", "'gpt2' is not one simsp reads"]),
    ('{"model_type": "llama", "hidden_size": 64}', ["num_hidden_layers", "missing"]),
    ('{"model_type": "llama", "hidden_size": NaN}', ["is not valid JSON"]),
    ('{"model_type": "llama", "hidden_size": true, "num_hidden_layers": 2, '
     '"num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 8}',
     ["hidden_size", "must be a number"]),
    ('{"model_type": "llama", "hidden_size": 64.5, "num_hidden_layers": 2, '
     '"num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 8}',
     ["hidden_size", "whole number"]),
    ('{"model_type": "llama", "hidden_act": "gelu", "hidden_size": 64}', ["hidden_act"]),
])
def test_hostile_hf_configs_are_one_error(capsys, tmp_path, text, words):
    path = tmp_path / "config.json"
    path.write_text(text)
    rc, out, err = cli(["run", "--hf-config", str(path)])
    assert_one_error(rc, out, err, str(path), *words)


@pytest.mark.parametrize("flag", ["--hf-config", "--megatron-args-file"])
def test_fifo_and_folder_are_refused(capsys, tmp_path, flag):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rc, out, err = cli(["run", flag, str(fifo)])
    assert_one_error(rc, out, err, str(fifo), "not a regular file")
    rc, out, err = cli(["run", flag, str(tmp_path)])
    assert_one_error(rc, out, err, "is a folder")


# --- bare simsp and help ----------------------------------------------------------------------

def test_bare_simsp_lists_every_command(capsys):
    rc, out, err = cli([])
    assert rc == 0 and err == ""
    listed = [line.split()[0] for line in out.split("commands:\n", 1)[1].splitlines()]
    assert listed == list(COMMANDS)


def test_objective_has_help(capsys):
    rc, out, _ = cli(["search", "--help"])
    assert rc == 0
    assert "what ranks the layouts" in " ".join(out.split())
