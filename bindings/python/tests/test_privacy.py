"""The privacy accountant: fedwan's epsilons against Google's dp-accounting."""

import math

import pytest

import fedwan

# (noise multiplier, rounds, delta) -> epsilon printed by dp-accounting 0.6.0's
# RdpAccountant for GaussianDpEvent(z) composed `rounds` times.
REFERENCES = [
    (1.0, 1, 1e-5, 4.728507067217623),
    (1.0, 10, 1e-5, 19.05359753163139),
    (2.0, 50, 1e-6, 23.70389051398901),
    (10.0, 1, 1e-5, 0.3752912223662765),
]


@pytest.mark.parametrize("z,rounds,delta,epsilon", REFERENCES)
def test_epsilon_matches_recorded_reference(z, rounds, delta, epsilon):
    assert fedwan.privacy_epsilon(z, rounds, delta) == pytest.approx(epsilon, rel=1e-9)


def test_epsilon_agrees_with_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting import rdp

    for z in (0.6, 1.0, 1.7, 4.0, 12.0):
        for rounds in (1, 5, 40, 300):
            for delta in (1e-5, 1e-6):
                theirs = rdp.RdpAccountant()
                theirs.compose(dp_accounting.GaussianDpEvent(z), rounds)
                want = theirs.get_epsilon(delta)
                ours = fedwan.PrivacyAccountant()
                ours.compose_gaussian(z, rounds)
                got = ours.epsilon(delta)
                assert got == pytest.approx(want, rel=0.01), (z, rounds, delta)


def test_accountant_composes_round_by_round():
    a = fedwan.PrivacyAccountant()
    assert a.epsilon(1e-5) == 0.0
    for _ in range(10):
        a.compose_gaussian(1.0)
    assert a.rounds == 10
    loss = a.loss(1e-5)
    assert loss["epsilon"] == pytest.approx(19.05359753163139, rel=1e-9)
    assert loss["delta"] == 1e-5
    assert loss["order"] > 1


def test_noise_for_a_target_and_rounds_within_a_budget():
    for target in (1.0, 3.0, 8.0):
        z = fedwan.noise_multiplier_for(target, 1e-5, 20)
        assert fedwan.privacy_epsilon(z, 20, 1e-5) <= target
        assert fedwan.privacy_epsilon(z * 0.999, 20, 1e-5) > target
        n = fedwan.privacy_rounds_within(target, 1e-5, z)
        assert n >= 20
        assert fedwan.privacy_epsilon(z, n + 1, 1e-5) > target


@pytest.mark.parametrize(
    "call",
    [
        lambda: fedwan.privacy_epsilon(0.0, 1, 1e-5),
        lambda: fedwan.privacy_epsilon(math.nan, 1, 1e-5),
        lambda: fedwan.privacy_epsilon(1.0, 1, 0.0),
        lambda: fedwan.noise_multiplier_for(-1.0, 1e-5, 3),
        lambda: fedwan.PrivacyAccountant([0.5]),
    ],
)
def test_bad_arguments_are_config_errors(call):
    with pytest.raises(fedwan.ConfigError):
        call()


def test_topology_privacy_settings_and_budget():
    text = """
job: dp
federation:
  rounds: 10
  privacy: {mode: central, clip: 1.5, noise_multiplier: 1.0, epsilon_budget: 12}
nodes:
  - {id: root, role: root, endpoint: "tcp://127.0.0.1:7000"}
  - {id: s1, role: site, parent: root}
  - {id: s2, role: site, parent: root}
"""
    topo = fedwan.Topology.parse(text)
    p = topo.federation.privacy
    assert p["mode"] == "central"
    assert p["clip"] == 1.5
    assert p["noise_multiplier"] == 1.0
    assert p["delta"] == 1e-5
    assert p["epsilon_budget"] == 12
    assert topo.rounds == 10
    assert topo.rounds_to_run == fedwan.privacy_rounds_within(12, 1e-5, 1.0)
    assert topo.rounds_to_run < 10
    with pytest.raises(fedwan.ConfigError, match="exactly one"):
        fedwan.Topology.parse(text.replace("noise_multiplier: 1.0, ", ""))
