"""The swap audit's rank-law columns (issue 54 item 6): per call site rho, the rank the law
predicts (``rpka.rank_law``) and the error measured at it, checked against an independent
recomputation from the call's own q, k and against the audit's own error at that rank."""

import math

import pytest
import torch
import torch.nn.functional as F

from rpka import rank_law
from rpka.swap import audit
from rpka.swap.example import EncoderLM

# a made-up law (not the committed fit): log2 r = 2 + 0.25 rho, so the test does not move
# when the study refits
FIT = {"rpka": {"statistic": "rho_bound", "terms": ["rho"], "coef": [2.0, 0.25]}}
OPTIONS = {"rpka": {"causal_block": 4}}


@pytest.fixture(scope="module")
def model_and_tokens():
    torch.manual_seed(0)
    model = EncoderLM(20, 32, d_model=16).train()  # train mode, dropout 0: the SDPA path
    tokens = torch.randint(0, 20, (4, 25), generator=torch.Generator().manual_seed(0))
    return model, tokens[:, :-1]


def recorded_calls(model, tokens):
    """Every SDPA call's (q, k, args) in an exact run, recorded by a wrapper of torch's."""
    calls, original = [], F.scaled_dot_product_attention

    def record(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        calls.append((q.detach().clone(), k.detach().clone(), scale))
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, **kw)  # fmt: skip

    F.scaled_dot_product_attention = record
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        F.scaled_dot_product_attention = original
    return calls


def expected_law(q, k, scale):
    """rho (largest head) and the predicted rank (largest head) from the law's formula,
    computed here from the definitions, not by the audit's code path."""
    q, k = q[:4].double(), k[:4].double()
    d = q.shape[-1]
    if scale is not None:
        q = q * scale * math.sqrt(d)
    rhos = []
    for h in range(q.shape[1]):
        centred = k[:, h] - k[:, h].mean(-2, keepdim=True)
        bound = q[:, h].norm(dim=-1).amax(-1) * centred.norm(dim=-1).amax(-1) / math.sqrt(d)
        rhos.append(float(bound.median()))
    n = k.shape[-2]
    ranks = [min(2 * n, math.ceil(2 ** (2.0 + 0.25 * r))) for r in rhos]
    return max(rhos), max(ranks)


def test_the_audit_shows_rho_the_predicted_rank_and_the_error_at_it(model_and_tokens):
    model, tokens = model_and_tokens
    calls = recorded_calls(model, tokens)
    assert len(calls) == 2  # one per layer
    expected = [expected_law(*call) for call in calls]
    predicted = expected[0][1]
    assert 4 <= predicted < 2 * tokens.shape[1], "the made-up law should land below full rank"
    table = audit(model, tokens, ranks=[2, predicted], methods=["rpka"], options=OPTIONS,
                  repeats=1, law_fit=FIT)  # fmt: skip
    sites = list(dict.fromkeys(table["site"]))
    assert sites == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    for site, (rho, rank) in zip(sites, expected, strict=True):
        rows = table[table["site"] == site]
        assert rows["rho"].tolist() == pytest.approx([rho] * len(rows), rel=1e-9)
        assert (rows["predicted_rank"] == rank).all()
        assert rows["error_at_predicted"].nunique() == 1  # a property of the site, not the row
    # the first site sees the same inputs in the exact run and the swapped one, and the call
    # at the predicted rank draws from the same seeded RNG: its error is the audit's own
    first = table[table["site"] == sites[0]]
    at_rank = first.loc[first["rank"] == predicted, "output_error"].iloc[0]
    assert first["error_at_predicted"].iloc[0] == pytest.approx(at_rank, rel=1e-9)
    assert 0 < at_rank < first.loc[first["rank"] == 2, "output_error"].iloc[0]
    assert table.attrs["law"] == {"eps": rank_law.DEFAULT_EPS, "source": "law_fit (given)"}


def test_the_law_columns_leave_the_exact_run_and_the_callers_rng_alone(model_and_tokens):
    model, tokens = model_and_tokens
    rng = torch.get_rng_state()
    with_law = audit(model, tokens, ranks=[4], options=OPTIONS, repeats=1, law_fit=FIT)
    assert torch.equal(torch.get_rng_state(), rng)
    without = audit(model, tokens, ranks=[4], options=OPTIONS, repeats=1, law_eps=None)
    assert with_law["model_output_error"].tolist() == without["model_output_error"].tolist()
    assert with_law["output_error"].tolist() == without["output_error"].tolist()
    assert without[["rho", "predicted_rank", "error_at_predicted"]].isna().all().all()
    assert without.attrs["law"]["eps"] is None


def test_a_method_without_a_fit_gets_nan_and_a_smaller_eps_a_larger_rank(model_and_tokens):
    model, tokens = model_and_tokens
    fit = {"rpka": {"statistic": "rho_bound", "terms": ["rho", "log2_inv_eps"],
                    "coef": [0.0, 0.25, 1.0]}}  # fmt: skip
    table = audit(model, tokens, ranks=[4], options=OPTIONS, repeats=1, law_fit=fit,
                  law_eps=0.1)  # fmt: skip
    tighter = audit(model, tokens, ranks=[4], options=OPTIONS, repeats=1, law_fit=fit,
                    law_eps=0.01)  # fmt: skip
    assert (tighter["predicted_rank"] > table["predicted_rank"]).all()
    # log2(0.1 / 0.01) = 3.3 more rungs, up to the cap at the full rank 2n
    full = 2 * tokens.shape[1]
    assert (tighter["predicted_rank"] >= (8 * table["predicted_rank"]).clip(upper=full)).all()
    only_other = {"keys-coreset": fit["rpka"]}  # a fit for another method only
    other = audit(model, tokens, ranks=[4], options=OPTIONS, repeats=1, law_fit=only_other)
    assert len(other) == 2
    assert other[["predicted_rank", "error_at_predicted"]].isna().all().all()
    assert other["rho"].tolist() == table["rho"].tolist()  # rho is the site's, any method


@pytest.mark.parametrize("law_eps", [0.0, 1.0, 1.5, -0.1, "0.03"])
def test_a_bad_law_eps_is_refused_before_any_run(law_eps):
    model = torch.nn.Linear(4, 4)  # would be refused later (no SDPA call): the eps is first
    with pytest.raises(ValueError, match=r"law_eps must be a number in \(0, 1\)"):
        audit(model, torch.randn(2, 4), ranks=[4], law_eps=law_eps, law_fit=FIT)


def test_without_a_committed_law_the_audit_warns_and_leaves_nan(
    model_and_tokens, tmp_path, monkeypatch
):
    model, tokens = model_and_tokens
    monkeypatch.setattr(rank_law, "LAW_FILE", str(tmp_path / "missing.json"))
    with pytest.warns(UserWarning, match="no rank law"):
        table = audit(model, tokens, ranks=[4], options=OPTIONS, repeats=1)
    assert table[["rho", "predicted_rank", "error_at_predicted"]].isna().all().all()
    assert "missing.json" in table.attrs["law"]["source"]
