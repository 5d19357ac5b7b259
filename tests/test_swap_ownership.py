"""Issue 52: the swap as a PyTorch user drives it - a swap that cannot stay installed
(out-of-order exits, overlapping threads), torch.compile, full rank meaning exact, half
precision and autocast, and the arguments SDPA itself refuses."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rpka.attention.rpka import CAUSAL_BLOCK
from rpka.swap import SwapRefused, swap
from rpka.swap.sdpa import TORCH_SDPA

SDPA = F.scaled_dot_product_attention  # what the module attribute is outside every swap


def qkv(L, S, heads=2, e=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, n, e, generator=g).to(dtype) for n in (L, S, S))


# ------------------------------------------------------------------------- ownership


def test_out_of_order_exits_put_sdpa_back():
    """The issue's exact sequence: a enters, b enters, a exits, b exits."""
    a, b = swap("rpka", rank=8), swap("rpka", rank=4)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    q, k, v = qkv(32, 32)
    F.scaled_dot_product_attention(q, k, v)  # still inside b: served by b
    assert b.swapped == 1 and a.swapped == 0
    b.__exit__(None, None, None)
    assert F.scaled_dot_product_attention is SDPA
    assert torch.allclose(F.scaled_dot_product_attention(q, k, v), TORCH_SDPA(q, k, v))


def test_overlapping_threads_end_with_the_original_back_and_serve_only_their_own_calls():
    """Two threads whose blocks overlap (t1 enters, t2 enters, t1 exits, t2 exits): SDPA
    is restored; while t1 is inside, a call from the main thread (in no swap) is exact."""
    q, k, v = qkv(32, 32)
    steps = [threading.Event() for _ in range(4)]
    served = {}

    def worker(name, enter_after, entered, exit_after, exited):
        steps[enter_after].wait(5) if enter_after is not None else None
        with swap("rpka", rank=4) as s:
            F.scaled_dot_product_attention(q, k, v)
            steps[entered].set()
            steps[exit_after].wait(5)
        served[name] = s.swapped
        steps[exited].set()

    t1 = threading.Thread(target=worker, args=("t1", None, 0, 1, 2))
    t2 = threading.Thread(target=worker, args=("t2", 0, 1, 2, 3))
    t1.start()
    t2.start()
    steps[0].wait(5)
    outside = F.scaled_dot_product_attention(q, k, v)  # main thread: in no swap
    t1.join(10)
    t2.join(10)
    assert served == {"t1": 1, "t2": 1}
    assert torch.allclose(outside, TORCH_SDPA(q, k, v), atol=1e-6)
    assert F.scaled_dot_product_attention is SDPA


def test_a_swap_entered_twice_as_a_decorator_exits_cleanly():
    s = swap("rpka", rank=4)

    @s
    def attend(depth):
        return attend(depth - 1) if depth else F.scaled_dot_product_attention(*qkv(16, 16))

    attend(3)
    assert s.swapped == 1 and F.scaled_dot_product_attention is SDPA


# ------------------------------------------------------------------------- torch.compile


class Block(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(1, -1, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_compiled_model_inside_a_swap_is_served_and_exact_outside(backend, causal):
    """Dynamo runs the dispatcher eagerly (a graph break): the compiled model's calls are
    served by RPKA, the same as the eager model's with the same pivot draws; outside the
    swap the compiled model recompiles to torch's SDPA."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block(causal)
    x = torch.randn(1, 2 * CAUSAL_BLOCK, 16)  # above the causal path's exact local block
    compiled = torch.compile(model, backend=backend)
    exact = compiled(x)  # compiled before the swap: torch's SDPA in the graph
    with torch.no_grad():
        torch.manual_seed(1)
        with swap("rpka", rank=8) as s_eager:
            eager = model(x)
        torch.manual_seed(1)
        with swap("rpka", rank=8) as s_compiled:
            served = compiled(x)
    assert s_eager.swapped == s_compiled.swapped == 1
    assert torch.allclose(served, eager, atol=1e-5)
    assert not torch.allclose(served, exact, atol=1e-3)  # rank 8 of 512 keys: approximated
    assert torch.allclose(compiled(x), model(x), atol=1e-6)  # outside: exact again


# ------------------------------------------------------------------------- full rank


@pytest.mark.parametrize("method", ["rpka", "nystrom-uniform", "keys-coreset"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(200, 200), (120, 200)])
def test_full_rank_means_exact(method, causal, shape):
    """Issue 52: rank >= the number of keys gives SDPA's result (the issue's L = S = 200 at
    rank 200 was 0.24 off), causal or not, L != S included."""
    L, S = shape
    if causal and L != S:
        pytest.skip("SDPA's is_causal with L != S is top-left aligned: not served by swap")
    q, k, v = qkv(L, S)
    ref = TORCH_SDPA(q, k, v, is_causal=causal)
    try:
        with swap(method, rank=S) as s:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    except SwapRefused as err:  # a non-causal peer refuses causal calls: never approximates
        assert causal and "is_causal" in str(err)
        return
    assert s.swapped == 1
    assert torch.allclose(out, ref, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32_and_returned_in_its_dtype(dtype):
    q, k, v = qkv(64, 64, dtype=dtype)
    with swap("rpka", rank=64) as s:  # full rank: exact, through the widened path
        out = F.scaled_dot_product_attention(q, k, v)
    assert out.dtype == dtype and s.swapped == 1
    ref = TORCH_SDPA(*(x.float() for x in (q, k, v)))
    assert torch.allclose(out.float(), ref, atol=2e-2)
    with swap("rpka", rank=8) as s:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == dtype and s.swapped == 1 and torch.isfinite(out).all()


def test_cpu_autocast_is_served():
    torch.manual_seed(0)
    model, x = Block(causal=True), torch.randn(1, 64, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16), swap("rpka", rank=8) as s:
        out = model(x)
    assert s.swapped == 1 and out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_an_integer_dtype_is_refused_naming_it():
    q, k, v = (x.to(torch.int32) for x in qkv(8, 8))
    with pytest.raises(SwapRefused, match="dtype torch.int32"), swap("rpka", rank=4):
        F.scaled_dot_product_attention(q, k, v)


# ------------------------------------------------------------------------- hostile campaign


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"dropout_p": float("nan")}, ValueError, "dropout_p must be a number in [0, 1], got nan"),
        ({"dropout_p": -0.1}, ValueError, "dropout_p must be a number in [0, 1], got -0.1"),
        ({"attn_mask": True}, TypeError, "attn_mask must be a Tensor or None, got bool"),
        ({"scale": float("nan")}, ValueError, "scale must be a finite number or None, got nan"),
    ],
)
@pytest.mark.parametrize("fallback", ["error", "exact"])
def test_arguments_sdpa_refuses_are_refused_naming_them(kwargs, error, words, fallback):
    """Issue 52, item 9: these were served as if valid, or failed naming something else."""
    with pytest.raises(error) as caught, swap("rpka", rank=4, fallback=fallback):
        F.scaled_dot_product_attention(*qkv(8, 8), **kwargs)
    assert str(caught.value) == words
    assert F.scaled_dot_product_attention is SDPA


# ------------------------------------------------------------------------- audit honesty


class WithLogits:
    """A Hugging Face ModelOutput's shape of interest: logits as an attribute."""

    def __init__(self, logits):
        self.logits = logits


class Wrapped(nn.Module):
    """A causal model whose output is a ModelOutput-like object, or a tuple."""

    def __init__(self, as_tuple: bool) -> None:
        super().__init__()
        self.block, self.as_tuple = Block(causal=True), as_tuple

    def forward(self, x):
        out = self.block(x)
        return (out, out.sum()) if self.as_tuple else WithLogits(out)


def test_a_method_that_served_nothing_gets_no_row_but_a_warning():
    """Issue 52, item 6: uniform landmarks on a causal model served no call; its rows read
    metric change 0 and output error NaN, a free lunch. Now: no rows, a warning, and
    attrs['not_served'] says which and why."""
    from rpka.swap import audit

    torch.manual_seed(0)
    model, x = Block(causal=True), torch.randn(1, 256, 16)
    with pytest.warns(UserWarning, match="nystrom-uniform at rank 8 served no SDPA call"):
        table = audit(model, x, ranks=[8], methods=["rpka", "nystrom-uniform"], repeats=1,
                      metric=lambda out: float(out.mean()))  # fmt: skip
    assert set(table["method"]) == {"rpka"}
    assert [(r["method"], r["rank"]) for r in table.attrs["not_served"]] == [("nystrom-uniform", 8)]
    assert "is_causal=True" in next(iter(table.attrs["not_served"][0]["reasons"]))


@pytest.mark.parametrize("as_tuple", [False, True])
def test_model_output_objects_and_tuples_are_scored_by_their_logits(as_tuple):
    from rpka.swap import audit

    torch.manual_seed(0)
    model, x = Wrapped(as_tuple), torch.randn(1, 256, 16)
    table = audit(model, x, ranks=[8, 256], methods=["rpka"], repeats=1)
    errors = dict(zip(table["rank"], table["model_output_error"], strict=True))
    assert 0 < errors[8] < 1 and errors[256] < 1e-5  # measured, and exact at full rank


def test_the_command_line_takes_a_model_file_and_names_what_fails(tmp_path, capsys):
    """`--model ./mymodel.py:f` (a traceback before), a file that fails on import, and
    targets that do not fit the output: one line each, exit 2."""
    from rpka.swap import command

    tests = str(Path(__file__).parent)
    (tmp_path / "mymodel.py").write_text(
        f"import sys\nsys.path.insert(0, {tests!r})\nfrom test_swap_ownership import Wrapped\n"
        "def f():\n    return Wrapped(as_tuple=False)\n"
    )
    (tmp_path / "broken.py").write_text("raise RuntimeError('no GPU here')\n")
    torch.save(torch.randn(1, 256, 16), tmp_path / "x.pt")
    torch.save({"inputs": torch.randn(1, 256, 16), "targets": torch.randint(0, 5, (3,))},
               tmp_path / "xt.pt")  # fmt: skip
    out = str(tmp_path / "out")
    table = command.main(["--model", f"{tmp_path}/mymodel.py:f", "--batch", str(tmp_path / "x.pt"),
                          "--ranks", "8", "--repeats", "1", "--out", out])  # fmt: skip
    assert list(table["method"]) == ["rpka"]
    capsys.readouterr()
    for argv, says in [
        (["--model", f"{tmp_path}/broken.py:f", "--batch", "b"], "RuntimeError: no GPU here"),
        (["--model", f"{tmp_path}/absent.py:f", "--batch", "b"], "no file"),
        (
            ["--model", f"{tmp_path}/mymodel.py:f", "--batch", str(tmp_path / "xt.pt")],
            "the targets do not fit the model's output (1, 2, 256, 8) float32",
        ),
    ]:
        with pytest.raises(SystemExit) as stop:
            command.main([*argv, "--out", out])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_notebook_07_audits_the_users_model_from_its_parameters(tmp_path):
    """Issue 52, item 8: the notebook takes the user's factory, weights and batch as
    papermill parameters (as `python -m rpka swap` does); parts (a) and (b) read only."""
    import nbformat
    import papermill

    from rpka.swap.example import encoder_lm

    repo = Path(__file__).resolve().parents[1]
    torch.save(encoder_lm().state_dict(), tmp_path / "w.pt")
    tokens = torch.randint(0, 51, (2, 65), generator=torch.Generator().manual_seed(0))
    torch.save({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}, tmp_path / "b.pt")
    papermill.execute_notebook(
        str(repo / "notebooks" / "07_your_model.ipynb"), str(tmp_path / "out.ipynb"),
        kernel_name="python3", progress_bar=False, cwd=str(repo),
        parameters={"compute_missing": False, "figures_dir": str(tmp_path),
                    "swap_audit_json": str(tmp_path / "none.json"),
                    "user_model": "rpka.swap.example:encoder_lm",
                    "user_weights": str(tmp_path / "w.pt"), "user_batch": str(tmp_path / "b.pt"),
                    "user_ranks": [8]},
    )  # fmt: skip
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    shown = "".join(str(o.get("data", {})) for c in out.cells for o in c.get("outputs", []))
    assert "encoder.layers.0.self_attn" in shown and "metric_change" in shown


@pytest.mark.parametrize(
    "given, says",
    [
        ({"user_ranks": [0, 8]}, "parameter user_ranks must be a list of integers >= 1"),
        ({"user_ranks": "16"}, "parameter user_ranks must be a list of integers >= 1"),
        ({"user_model": ""}, "parameter user_model must be a non-empty string or None"),
        ({"user_batch": 3}, "parameter user_batch must be a non-empty string or None"),
    ],
)
def test_notebook_07_refuses_bad_user_parameters_in_one_line(given, says):
    from rpka.study.notebook_params import ParameterError, check

    with pytest.raises(ParameterError, match=says):
        check("07_your_model.ipynb", given)
    assert check("07_your_model.ipynb", {})["user_ranks"] == [16, 64]


def test_importing_the_swap_loads_no_compiler():
    """`torch.compiler.disable` imports torch._dynamo (about 1 s, numba with it): the
    dispatcher is wrapped when the first swap enters, not when `rpka.swap` is imported."""
    code = (
        "import sys, torch; import rpka.swap; print('torch._dynamo' in sys.modules);"
        "from rpka.swap import swap\n"
        "with swap('rpka', rank=4): pass\n"
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
