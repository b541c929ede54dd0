"""GRPO math on hand-built groups: advantages, the two-sided clip (zero gradient where clipped), the normaliser."""

import math

import pytest
import torch

from trainer.grpo import (
    LossConfig,
    clip_gradients,
    constant_normaliser,
    decoupled_policy_loss,
    group_advantages,
    grpo_loss,
    k3_kl,
    keep_informative_groups,
    length_instruction,
    length_penalised_reward,
    token_policy_loss,
)

CFG = LossConfig(entropy_coef=0.0)


def test_advantages_are_standardised_within_the_group():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # mean 0.5, population std 0.5 -> +-1/(0.5 + 1e-6)
    expected = 0.5 / (0.5 + 1e-6)
    assert torch.allclose(adv, torch.tensor([expected, -expected, -expected, expected]))
    assert abs(float(adv.sum())) < 1e-6


def test_all_equal_rewards_and_singleton_groups_give_zero_advantages():
    assert torch.equal(group_advantages(torch.tensor([0.7, 0.7, 0.7])), torch.zeros(3))
    assert torch.equal(group_advantages(torch.tensor([1.0])), torch.zeros(1))


def test_online_filter_drops_groups_without_signal():
    advs = [group_advantages(torch.tensor(r)) for r in ([1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.3])]
    assert keep_informative_groups(advs) == [1]


def _grad_of_loss(ratio: float, advantage: float, cfg: LossConfig = CFG) -> tuple[float, bool]:
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, clipped = token_policy_loss(logp, torch.zeros(1, 1), torch.tensor([advantage]), cfg)
    loss.sum().backward()
    return float(logp.grad), bool(clipped)


@pytest.mark.parametrize(
    "ratio,advantage,zero_grad",
    [
        (1.1, 1.0, False),  # inside the trust region: gradient flows
        (1.1, -1.0, False),
        (1.5, 1.0, True),  # above 1 + eps_high with A > 0: clipped
        (0.5, -1.0, True),  # below 1 - eps_low with A < 0: clipped
        (0.5, 1.0, False),  # below 1 - eps_low with A > 0: PPO keeps the gradient (pushes the ratio back up)
        (1.5, -1.0, False),  # above 1 + eps with A < 0: PPO keeps the gradient ...
        (6.0, -1.0, True),  # ... unless the ratio exceeds delta = 4: INTELLECT-2's second side
    ],
)
def test_two_sided_clip_zeroes_the_gradient_exactly_where_clipped(ratio, advantage, zero_grad):
    grad, clipped = _grad_of_loss(ratio, advantage)
    assert (grad == 0.0) == zero_grad
    assert clipped == zero_grad
    if not zero_grad:
        # d(-ratio * A)/d logp = -ratio * A
        assert grad == pytest.approx(-ratio * advantage, rel=1e-5)


def test_delta_caps_the_loss_of_a_negative_advantage():
    loss, _ = token_policy_loss(torch.tensor([[math.log(100.0)]]), torch.zeros(1, 1), torch.tensor([-2.0]), CFG)
    assert float(loss) == pytest.approx(4.0 * 2.0)


def _decoupled_grad(weight: float, advantage: float) -> tuple[float, float, bool]:
    """(loss, d loss / d logp, clipped) of one token sampled with probability 1 / weight of the live policy's."""
    logp = torch.tensor([[0.0]], requires_grad=True)
    loss, clipped = decoupled_policy_loss(logp, torch.tensor([[-math.log(weight)]]), torch.tensor([advantage]), CFG)
    loss.sum().backward()
    return float(loss), float(logp.grad), bool(clipped)


@pytest.mark.parametrize("ratio,advantage", [(1.0, 1.0), (1.0, -1.0), (1.5, 1.0), (0.5, -1.0), (1.1, 1.0)])
def test_decoupled_loss_weights_staleness_instead_of_clipping_it(ratio, advantage):
    """A token whose behaviour ratio left the PPO interval before this step still teaches, weighted by that ratio
    (the coupled loss zeroes it); on-policy (ratio 1) both losses give the same gradient."""
    loss, grad, clipped = _decoupled_grad(ratio, advantage)
    assert grad == pytest.approx(-ratio * advantage, rel=1e-5) and not clipped
    assert loss == pytest.approx(-ratio * advantage, rel=1e-5)
    coupled_grad, coupled_clipped = _grad_of_loss(ratio, advantage)
    if ratio == 1.0:
        assert coupled_grad == pytest.approx(grad, rel=1e-6)
    if ratio in (1.5, 0.5):
        assert coupled_clipped and coupled_grad == 0.0


def test_decoupled_weight_is_capped_at_delta_and_never_differentiated():
    loss, grad, clipped = _decoupled_grad(100.0, -2.0)
    assert loss == pytest.approx(4.0 * 2.0) and grad == pytest.approx(4.0 * 2.0) and clipped
    stale = torch.tensor([[0.3]], requires_grad=True)  # the behaviour logprobs get no gradient through the weight
    logp = torch.tensor([[0.0]], requires_grad=True)
    decoupled_policy_loss(logp, stale, torch.tensor([1.0]), CFG)[0].sum().backward()
    assert stale.grad is None or float(stale.grad) == 0.0


def test_grpo_loss_uses_the_decoupled_form_only_when_configured():
    logits = torch.tensor([[[0.0, 1.0, -1.0]]], requires_grad=True)
    old = torch.tensor([[math.log(0.2)]])  # the token was rarer when sampled: behaviour ratio > 1 + eps_high
    args = (torch.tensor([[1]]), torch.ones(1, 1), old, torch.tensor([1.0]))
    grads = []
    for decoupled in (False, True):
        logits.grad = None
        loss, _ = grpo_loss(logits, *args, temperature=1.0, normaliser=1.0,
                            cfg=LossConfig(entropy_coef=0.0, decoupled=decoupled))
        loss.backward()
        grads.append(logits.grad.clone())
    assert torch.count_nonzero(grads[0]) == 0 and torch.count_nonzero(grads[1]) == 3


def test_constant_normaliser_is_batch_times_max_tokens_not_per_sequence():
    assert constant_normaliser(8, 128) == 1024.0
    # Two sequences of different lengths: each real token weighs 1/(B*T) whatever its sequence length.
    logits = torch.zeros(2, 4, 3, requires_grad=True)
    tokens = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    old = torch.full((2, 4), math.log(1 / 3))
    loss, stats = grpo_loss(logits, tokens, mask, old, torch.tensor([1.0, 1.0]), temperature=1.0,
                            normaliser=constant_normaliser(2, 4), cfg=CFG)
    assert stats.tokens == 5
    assert float(loss) == pytest.approx(-5 / 8)  # ratio 1 on 5 real tokens, A = 1, divided by 2 x 4
    loss.backward()
    per_token = logits.grad[:, :, 0]
    assert torch.allclose(per_token[0, 0], per_token[1, 3])
    assert torch.all(per_token[0, 1:] == 0)


def test_entropy_bonus_lowers_the_loss_and_kl_raises_it():
    logits = torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[1, 2, 3]])
    mask = torch.ones(1, 3)
    old = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    kw = dict(temperature=1.0, normaliser=3.0)
    base, _ = grpo_loss(logits, tokens, mask, old, torch.tensor([0.0]), cfg=CFG, **kw)
    ent, stats = grpo_loss(logits, tokens, mask, old, torch.tensor([0.0]), cfg=LossConfig(entropy_coef=0.1), **kw)
    assert float(ent) == pytest.approx(float(base) - 0.1 * stats.entropy)
    ref = old - 0.5
    kl, kstats = grpo_loss(
        logits,
        tokens,
        mask,
        old,
        torch.tensor([0.0]),
        cfg=LossConfig(entropy_coef=0.0, kl_coef=1.0),
        ref_logprobs=ref,
        **kw,
    )
    assert kstats.kl == pytest.approx(math.exp(-0.5) + 0.5 - 1.0, rel=1e-5)
    assert float(kl) > float(base)


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere():
    lp = torch.tensor([-1.0, -2.0])
    assert torch.equal(k3_kl(lp, lp), torch.zeros(2))
    assert torch.all(k3_kl(lp, lp + torch.tensor([0.3, -0.3])) > 0)


def test_stale_rollout_is_importance_weighted_by_the_generating_policy():
    # Rollout sampled when the token had prob 0.5; the current policy gives it 0.55: ratio 1.1, inside the region,
    # so the gradient is scaled by the ratio (the importance weight), not by 1.
    current = torch.tensor([[math.log(0.55)]], requires_grad=True)
    loss, _ = token_policy_loss(current, torch.tensor([[math.log(0.5)]]), torch.tensor([1.0]), CFG)
    loss.sum().backward()
    assert float(current.grad) == pytest.approx(-1.1, rel=1e-5)


def test_gradient_clipping_reports_the_norm_and_scales_down():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3.0, 4.0])
    assert clip_gradients([p], 0.1) == pytest.approx(5.0)
    assert float(p.grad.norm()) == pytest.approx(0.1, rel=1e-4)


def test_length_penalty_and_instruction():
    assert length_penalised_reward(1.0, 120, 100) == pytest.approx(1.0 - 0.0003 * 20)
    assert length_penalised_reward(1.0, 120, None) == 1.0
    assert length_instruction(100) == "Think for 100 tokens."
