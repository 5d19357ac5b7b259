"""rpka.swap: torch SDPA served by an approximation inside any model (issue 42), its audit
and its command line."""

import itertools
import math
import re

import nbformat
import papermill
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rpka.attention import build
from rpka.bench import run_bench
from rpka.config.presets import get_preset
from rpka.io import read_json, read_run_file
from rpka.model import STUDY_NUMERICS
from rpka.paths import REPO_ROOT
from rpka.study.dropin import drop_in, swapped_model
from rpka.swap import SwapRefused, audit, plot_errors, swap
from rpka.swap import command as swap_command
from rpka.swap.example import EncoderLM, encoder_lm, next_token_loss
from rpka.swap.sdpa import causal_mask_kind
from rpka.tracks import get_task
from rpka.training.executors import InProcessExecutor
from rpka.training.run_config import STREAM_PIVOTS, derive_seed
from rpka.training.train import track_config_of
from rpka.training.trained import load_run_state

SDPA = F.scaled_dot_product_attention
TOL = {torch.float32: 2e-5, torch.float64: 1e-11}
FULL = 10_000  # above every point count below: full rank


def qkv(L, S, dtype, heads_kv=4, lead=(2,), e=8, ev=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, 4, L, e, generator=g, dtype=dtype)
    k = torch.randn(*lead, heads_kv, S, e, generator=g, dtype=dtype)
    v = torch.randn(*lead, heads_kv, S, ev, generator=g, dtype=dtype)
    return q, k, v


# every supported combination: method, dtype, (L, S), causal, scale, GQA
CASES = [
    (m, dt, ls, causal, scale, gqa)
    for m, dt, ls, causal, scale, gqa in itertools.product(
        ("rpka", "nystrom-uniform", "keys-coreset"),
        (torch.float32, torch.float64),
        ((24, 24), (12, 20)),
        (False, True),
        (None, 0.3),
        (False, True),
    )
    if not causal or (m == "rpka" and ls[0] == ls[1])  # causal: rpka only, L == S
]


@pytest.mark.parametrize("method, dtype, ls, causal, scale, gqa", CASES)
def test_full_rank_reproduces_sdpa_for_every_supported_argument(
    method, dtype, ls, causal, scale, gqa
):
    q, k, v = qkv(*ls, dtype, heads_kv=2 if gqa else 4)
    args = {"is_causal": causal, "scale": scale, "enable_gqa": gqa}
    ref = SDPA(q, k, v, **args)
    # causal_block 8 < L: the causal estimate runs across blocks, not one exact block
    options = {"causal_block": 8} if method == "rpka" else {}
    with swap(method, rank=FULL, **options) as s:
        out = F.scaled_dot_product_attention(q, k, v, **args)
    assert (s.swapped, s.passed) == (1, 0)
    assert out.dtype == dtype and out.shape == ref.shape
    assert (out - ref).abs().max() <= TOL[dtype]


def test_three_dim_inputs_and_masks_that_are_causal_or_mask_nothing_are_served():
    q, k, v = (x[0] for x in qkv(16, 16, torch.float64))  # (H, n, d): no batch dim
    with swap("rpka", rank=FULL, causal_block=4) as s:
        plain = F.scaled_dot_product_attention(q, k, v)
        tril = torch.ones(16, 16, dtype=torch.bool).tril()
        causal = F.scaled_dot_product_attention(q, k, v, attn_mask=tril)
        hf = torch.zeros(16, 16, dtype=torch.float64).masked_fill(~tril, torch.finfo(q.dtype).min)
        causal_float = F.scaled_dot_product_attention(q, k, v, attn_mask=hf)
    assert s.swapped == 3
    assert torch.allclose(plain, SDPA(q, k, v), atol=1e-12)
    assert torch.allclose(causal, SDPA(q, k, v, is_causal=True), atol=1e-12)
    assert torch.allclose(causal_float, SDPA(q, k, v, is_causal=True), atol=1e-12)
    assert causal_mask_kind(torch.ones(4, 4, dtype=torch.bool), 4, 4) == "none"
    assert causal_mask_kind(torch.randn(4, 4), 4, 4) is None  # a bias, not a mask


def test_low_rank_is_the_registered_method_on_the_scaled_queries():
    """Below full rank the swap is the method itself: the same draws give the same output
    as calling rpka.attention.build on q * scale * sqrt(E) - and differ from exact."""
    q, k, v = qkv(32, 32, torch.float64)
    with swap("rpka", rank=4, generator=torch.Generator().manual_seed(1)):
        out = F.scaled_dot_product_attention(q, k, v, scale=0.2)
    direct = build("rpka", rank=4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, direct(q * (0.2 * math.sqrt(8)), k, v))
    assert (out - SDPA(q, k, v, scale=0.2)).norm() / SDPA(q, k, v, scale=0.2).norm() > 1e-3


# ------------------------------------------------------------------------- restoration


def test_the_original_is_back_after_exit_exception_nesting_and_interrupt():
    q, k, v = qkv(8, 8, torch.float32)
    with swap("rpka", rank=4) as outer:
        replaced = F.scaled_dot_product_attention
        assert replaced is not SDPA
        with swap("nystrom-uniform", rank=4) as inner:
            F.scaled_dot_product_attention(q, k, v)
        assert F.scaled_dot_product_attention == replaced  # the outer swap again
        F.scaled_dot_product_attention(q, k, v)
    assert F.scaled_dot_product_attention is SDPA
    assert (inner.swapped, outer.swapped) == (1, 1)  # the innermost block serves
    for error in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)), swap("rpka", rank=4):
            raise error
        assert F.scaled_dot_product_attention is SDPA


def test_as_a_decorator_also_when_it_recurses():
    @swap("rpka", rank=FULL)
    def attend(depth):
        assert F.scaled_dot_product_attention is not SDPA
        return (
            attend(depth - 1)
            if depth
            else F.scaled_dot_product_attention(*qkv(8, 8, torch.float64))
        )

    out = attend(2)
    assert F.scaled_dot_product_attention is SDPA
    assert torch.allclose(out, SDPA(*qkv(8, 8, torch.float64)), atol=1e-12)


# ------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "kwargs, inputs, reason",
    [
        ({"attn_mask": torch.randn(8, 8)}, torch.float32, "attn_mask"),
        ({"dropout_p": 0.1}, torch.float32, "dropout_p=0.1"),
        ({"is_causal": True}, "L != S", "L=8 != S=12"),
    ],
)
def test_what_cannot_be_served_is_refused_or_run_exactly_and_counted(kwargs, inputs, reason):
    q, k, v = qkv(8, 12 if inputs == "L != S" else 8, torch.float32)
    with pytest.raises(SwapRefused, match=reason), swap("rpka", rank=4):
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert F.scaled_dot_product_attention is SDPA
    torch.manual_seed(0)
    ref = SDPA(q, k, v, **kwargs)
    torch.manual_seed(0)  # dropout draws: the fallback is the original function itself
    with pytest.warns(UserWarning, match="1 of 1 SDPA calls ran exact"):
        with swap("rpka", rank=4, fallback="exact") as s:
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert (s.swapped, s.passed) == (0, 1) and torch.equal(out, ref)


def test_a_device_other_than_cpu_or_cuda_is_refused():
    q, k, v = (x.to("meta") for x in qkv(8, 8, torch.float32))
    with pytest.raises(SwapRefused, match="device meta"), swap("rpka", rank=4):
        F.scaled_dot_product_attention(q, k, v)


def test_a_non_causal_peer_refuses_causal_calls():
    with pytest.raises(SwapRefused, match="is_causal=True .*nystrom-uniform"):
        with swap("nystrom-uniform", rank=4):
            F.scaled_dot_product_attention(*qkv(8, 8, torch.float32), is_causal=True)


def test_a_model_with_dropout_or_a_bias_mask_is_never_silently_swapped():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True).train()
    x = torch.randn(2, 6, 16)
    with pytest.raises(SwapRefused, match="dropout_p=0.1"), swap("rpka", rank=4):
        layer(x)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).train()
    bias = torch.randn(6, 6)  # an additive bias: refused (key padding is served, test_masks)
    with pytest.warns(UserWarning, match="attn_mask"):
        with swap("rpka", rank=4, fallback="exact") as s:
            layer(x, src_mask=bias)
            layer(x)
    assert (s.swapped, s.passed) == (1, 1)


# ------------------------------------------------------------------------- gradients


def test_a_training_step_inside_swap_gets_the_gradients_of_exact_at_full_rank():
    tokens = torch.randint(0, 20, (3, 17), generator=torch.Generator().manual_seed(0))
    grads = {}
    for method in ("exact", "rpka"):
        torch.manual_seed(0)
        model = EncoderLM(20, 16, d_model=16).double()
        optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
        options = {"causal_block": 4} if method == "rpka" else {}
        with swap(method, rank=FULL, **options) as s:
            loss = next_token_loss(model(tokens[:, :-1]), tokens)
            loss.backward()
            optimiser.step()
        assert s.swapped == 2  # both layers
        grads[method] = model.encoder.layers[0].self_attn.in_proj_weight.grad.clone()
    assert grads["rpka"].abs().sum() > 0
    assert torch.allclose(grads["rpka"], grads["exact"], atol=1e-10)


# ------------------------------------------------------------------------- the audit


def test_the_audit_refuses_a_model_that_made_no_sdpa_call():
    with pytest.raises(SwapRefused, match="no SDPA call"):
        audit(nn.Linear(4, 4), torch.randn(2, 4), ranks=[4])
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1, enable_nested_tensor=False
    ).eval()  # eval under no_grad: the fused fast path, no SDPA call
    with pytest.raises(SwapRefused, match="fast path"):
        audit(encoder, torch.randn(2, 6, 16), ranks=[4])


def test_the_audit_table_per_call_site_and_its_figure():
    torch.manual_seed(0)
    model = EncoderLM(20, 16, d_model=16).train()
    tokens = torch.randint(0, 20, (4, 17), generator=torch.Generator().manual_seed(0))
    rng = torch.get_rng_state()
    table = audit(
        model, tokens[:, :-1], ranks=[2, FULL], methods=["rpka"],
        metric=lambda out: next_token_loss(out, tokens), options={"rpka": {"causal_block": 4}},
        repeats=1,
    )  # fmt: skip
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG is left alone
    assert list(table["site"].unique()) == [f"encoder.layers.{i}.self_attn" for i in (0, 1)]
    assert (table["swapped"] == 1).all() and (table["calls"] == 1).all()
    full, low = table[table["rank"] == FULL], table[table["rank"] == 2]
    assert (full["output_error"] < 1e-5).all() and (low["output_error"] > 1e-3).all()
    assert (full["metric_change"].abs() < 1e-4).all()
    assert (table["logit_std"] > 0).all() and (table["forward_cpu_s"] > 0).all()
    assert len(plot_errors(table).axes[0].lines) == 2  # one line per (site, method)


@pytest.fixture(scope="module")
def study_model(tmp_path_factory):
    """A study model: exact's trained run of a one-epoch smoke bench (seconds)."""
    root = tmp_path_factory.mktemp("swap_study")
    config = get_preset("smoke", train={"epochs": 1}, seeds_per_job=1)
    run_bench(config, root / "out", InProcessExecutor(), progress=False, data_dir=root / "c")
    return root


def test_the_audit_agrees_with_drop_in_on_a_study_model(study_model):
    out, cache = study_model / "out", str(study_model / "c")
    reading = drop_in(out, ranks=["4", "full"], methods=["rpka"], windows=32, data_dir=cache,
                      out=study_model / "drop_in.json", log=None)  # fmt: skip
    report = read_json(out / "bench_report.json")
    run = read_run_file(reading["run_file"])
    config, state = {**run["config"], "device": "cpu"}, load_run_state(reading["run_file"], run)
    task = get_task(report["track"])
    x, y = task.inputs_targets(task.load(track_config_of(config), cache), "test")
    x, y = x[:32], y[:32]
    name = report["metric"]

    def metric(output):
        return float(task.finish(task.error_sums(output, y), task.count(y))[name][0])

    # drop-in's RPKA draws from the run's pivot generator; the audit is given the same
    pivots = derive_seed(*config["seeds"], STREAM_PIVOTS)
    for dtype in (torch.float32, torch.float64):
        exact = swapped_model(config, state, "exact", 1, dtype)
        generator = torch.Generator().manual_seed(pivots)
        table = audit(exact, x.to(dtype).expand(1, *x.shape), ranks=[4, 64], metric=metric,
                      options={"rpka": {"generator": generator, **STUDY_NUMERICS}},
                      repeats=1)  # fmt: skip
        assert list(table["site"].unique()) == ["blocks.0.attention"]
        key = str(dtype).split(".")[1]
        assert table["metric_exact"].iloc[0] == pytest.approx(reading["exact"][key][0], abs=1e-12)
        for rank in (4, 64):
            row = next(r for r in reading["rows"] if r["rank"] == rank and r["dtype"] == key)
            audited = table.loc[table["rank"] == rank, "metric"].iloc[0]
            assert audited == pytest.approx(row[name][0], abs=1e-12), (dtype, rank)
    # the output error: 0 at full rank in both; at rank 4 the same law (drop-in averages
    # three draws on the first 4 items, the audit one draw on every item)
    rows = [r for r in reading["rows"] if "output_error" in r]
    assert rows[-1]["output_error"]["error_mean"] == 0.0
    assert table.loc[table["rank"] == 64, "output_error"].iloc[0] < 1e-12
    ratio = (
        table.loc[table["rank"] == 4, "output_error"].iloc[0]
        / rows[0]["output_error"]["error_mean"]
    )
    assert 0.5 < ratio < 2.0


# ------------------------------------------------------------------------- command line


def test_the_command_line_audits_a_saved_model_and_refuses_in_one_line(tmp_path, capsys):
    torch.save(encoder_lm(n_tokens=51, max_len=64).state_dict(), tmp_path / "w.pt")
    tokens = torch.randint(0, 51, (2, 17), generator=torch.Generator().manual_seed(0))
    torch.save({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}, tmp_path / "b.pt")
    torch.save(torch.zeros(2, 3, 4), tmp_path / "bad.pt")
    base = ["--model", "rpka.swap.example:encoder_lm", "--weights", str(tmp_path / "w.pt")]
    table = swap_command.main(
        [*base, "--batch", str(tmp_path / "b.pt"), "--ranks", "4", "--repeats", "1",
         "--option", "rpka.causal_block=4", "--out", str(tmp_path / "out")]
    )  # fmt: skip
    assert len(table) == 2 and (tmp_path / "out" / "audit.png").exists()
    assert read_json(tmp_path / "out" / "audit.json")["rows"][0]["method"] == "rpka"
    capsys.readouterr()
    for argv, says in [
        (["--model", "rpka.swap.example:nothing", "--batch", "b"], "no callable 'nothing'"),
        (["--model", "no_such_pkg.m:f", "--batch", "b"], "cannot import 'no_such_pkg.m'"),
        ([*base[:3], str(tmp_path / "missing.pt"), "--batch", "b"], "cannot load"),
        ([*base[:3], str(tmp_path / "b.pt"), "--batch", "b"], "does not fit"),
        ([*base, "--batch", str(tmp_path / "bad.pt")], "does not take inputs (2, 3, 4)"),
    ]:
        with pytest.raises(SystemExit) as stop:
            swap_command.main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------------- docs, notebook


def test_the_five_line_use_in_docs_runs():
    text = (REPO_ROOT / "docs" / "swap.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    assert len([line for line in block.splitlines() if line.strip()]) == 5  # five lines
    torch.manual_seed(0)
    tokens = torch.randint(0, 20, (2, 17), generator=torch.Generator().manual_seed(0))
    namespace = {
        "model": EncoderLM(20, 16, d_model=16),
        "x": tokens[:, :-1],
        "loss_of": lambda out: next_token_loss(out, tokens),
    }
    with pytest.warns(UserWarning, match="keys-coreset at rank 16 served no SDPA call"):
        exec(block, namespace)  # keys-coreset is not causal: no rows, a warning
    table = namespace["table"]
    assert namespace["s"].swapped == 2
    assert set(table["method"]) == {"rpka"} and set(table["swapped"]) == {1.0}
    assert {r["method"] for r in table.attrs["not_served"]} == {"keys-coreset"}


def test_notebook_07_committed_clean_and_runs_under_papermill(tmp_path):
    path = REPO_ROOT / "notebooks" / "07_your_model.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert nb.metadata["kernelspec"]["name"] == "rpka"
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert "parameters" in code[0].metadata.get("tags", [])
    for line in code[0].source.splitlines():  # literals only
        assert line.startswith("#") or re.fullmatch(r"\w+ = .+", line), line
    papermill.execute_notebook(
        str(path), str(tmp_path / "out.ipynb"), kernel_name="python3", progress_bar=False,
        parameters={"swap_audit_json": str(tmp_path / "swap_audit.json"),
                    "figures_dir": str(tmp_path)},
        cwd=str(REPO_ROOT),
    )  # fmt: skip
    assert (tmp_path / "07_your_model_errors.png").stat().st_size > 0
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    shown = "".join(str(o.get("data", {})) for c in out.cells for o in c.get("outputs", []))
    assert "between the audit and the drop-in reading: 0.0e+00" in shown


def test_the_command_line_refuses_an_out_that_is_a_file_before_any_work(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stop:
        swap_command.main(
            ["--model", "no_such_pkg.m:f", "--batch", "b", "--out", str(tmp_path / "file")]
        )
    assert stop.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err


def test_an_unknown_method_or_option_is_refused_when_the_swap_is_made():
    for method, options in (("rpka", {"nope": 1}), ("exact", {"causal_block": 4})):
        with pytest.raises(ValueError, match="unknown option"):
            swap(method, rank=4, **options)
    with pytest.raises(ValueError, match="unknown attention method"):
        swap("rpkaa")
    with pytest.raises(ValueError, match="fallback must be one of"):
        swap("rpka", fallback="silent")
    assert F.scaled_dot_product_attention is SDPA
