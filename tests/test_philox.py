"""varbnn.philox: Philox4x32-10 in torch operations against its published known-answer vectors and an integer
reference, compiled as eager; its normals and uniforms against scipy's distributions; the draw dispatch."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from varbnn import philox

MASK = 0xFFFFFFFF

# Random123's known-answer vectors for philox4x32_10 (kat_vectors): counter, key, output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK,) * 4, (MASK,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def reference_philox(counter, key, rounds=10):
    """Philox4x32 on Python integers (Salmon et al. 2011, section 4.3)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return c0, c1, c2, c3


def _words(values):
    """One int64 tensor per word: of a tuple of words (0-d tensors), or of a list of such tuples (batched)."""
    columns = zip(*values) if isinstance(values, list) else values
    return [torch.tensor(column, dtype=torch.int64) for column in columns]


def test_known_answer_vectors():
    for counter, key, expected in KAT:
        out = philox.philox4x32(_words(counter), _words(key))
        assert tuple(int(w) for w in out) == expected
        assert reference_philox(counter, key) == expected


def _random_cases(n=300):
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, size=(n, 6), dtype=np.uint64).tolist()
    words[:4] = [[MASK] * 6, [0] * 6, [MASK, 0, MASK, 0, MASK, 0], [1, MASK, 1, MASK, 0, MASK]]  # carries and extremes
    return [(tuple(w[:4]), tuple(w[4:])) for w in words]


def test_equals_the_integer_reference_eager_and_compiled():
    """Batched over random counters and keys (extremes included: every product's high word, every carry); compiled by
    inductor too, whose C++ must compute the same integers as eager's kernels."""
    cases = _random_cases()
    counter = _words([c for c, _ in cases])
    key = _words([k for _, k in cases])
    expected = [reference_philox(c, k) for c, k in cases]
    eager = torch.stack(philox.philox4x32(counter, key), dim=1).tolist()
    assert [tuple(row) for row in eager] == expected
    compiled = torch.compile(philox.philox4x32, backend="inductor", fullgraph=True)
    assert torch.stack(compiled(counter, key), dim=1).tolist() == eager
    # fewer rounds are a different function (the rounds argument is used)
    assert philox.philox4x32(counter, key, rounds=7)[0].tolist() != [row[0] for row in eager]


def test_words_given_as_ints_and_a_known_schedule_give_the_same_numbers():
    """A word the same for every counter may be a Python int (no tensor operation until it meets one), and the key's
    round keys may be computed once (counter_draws does, for all its draws): the same words either way."""
    cases = _random_cases(50)
    counter = _words([c for c, _ in cases])
    key = (torch.tensor(cases[7][1][0]), torch.tensor(cases[7][1][1]))
    want = torch.stack(philox.philox4x32(counter, key), dim=1)
    as_ints = [counter[0], int(counter[1][3]), int(counter[2][3]), int(counter[3][3])]
    ints_want = torch.stack(philox.philox4x32([counter[0], *(torch.full_like(counter[0], w) for w in as_ints[1:])], key), 1)
    assert torch.equal(torch.stack(philox.philox4x32(as_ints, key), dim=1), ints_want)
    schedule = philox.key_schedule(*key)
    assert len(schedule) == philox.ROUNDS
    assert torch.equal(torch.stack(philox.philox4x32(counter, key, schedule=schedule), dim=1), want)
    # a key as two ints, every word an int but the first counter word: still full-shape tensors out, the reference's words
    out = philox.philox4x32([counter[0], 0, 0, 0], (int(key[0]), int(key[1])), rounds=1)
    assert all(w.shape == counter[0].shape for w in out)
    for row, c in zip(torch.stack(out, 1).tolist(), counter[0].tolist()):
        assert tuple(row) == reference_philox((c, 0, 0, 0), (int(key[0]), int(key[1])), rounds=1)
    with pytest.raises(ValueError, match="in \\[0, 2\\^32\\)"):
        philox.philox4x32([counter[0], 2**32, 0, 0], key)
    with pytest.raises(ValueError, match="fewer than rounds"):
        philox.philox4x32(counter, key, schedule=schedule[:3])
    with pytest.raises(ValueError, match="at least one"):
        philox.philox4x32([0, 0, 0, 0], (0, 0))


def test_every_output_bit_is_balanced():
    """Each of the 32 bits of the four words of 2^16 consecutive counters is set about half the time (binomial,
    |z| < 5 for each of the 128 bits); a constant or stuck bit fails."""
    key = torch.tensor(12345, dtype=torch.int64)
    words = torch.stack(philox._blocks(4 * 2**16, key, 0))  # (4, 65536)
    bits = (words.unsqueeze(-1) >> torch.arange(32)) & 1
    n = words.shape[1]
    z = (bits.sum(1).double() - n / 2) / math.sqrt(n / 4)
    assert float(z.abs().max()) < 5, float(z.abs().max())


KEY = torch.tensor(2**62 + 987654321, dtype=torch.int64)


def test_standard_normal_is_normal():
    z = philox.standard_normal((1000, 403), KEY, stream=3).double().numpy().ravel()  # n not a multiple of 4 per row
    assert stats.kstest(z, "norm").pvalue > 1e-3
    n = z.size
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs(stats.skew(z)) < 5 * math.sqrt(6 / n)
    assert abs(stats.kurtosis(z)) < 5 * math.sqrt(24 / n)
    assert np.abs(z).max() <= math.sqrt(64 * math.log(2)) + 1e-5
    # neighbours (same counter's four numbers and the next counter's) uncorrelated
    for lag in (1, 2, 3, 4, 5):
        r = np.corrcoef(z[:-lag], z[lag:])[0, 1]
        assert abs(r) < 5 / math.sqrt(n), (lag, r)


def test_streams_and_keys_are_reproducible_and_independent():
    a = philox.standard_normal((50_000,), KEY, stream=0)
    assert torch.equal(a, philox.standard_normal((50_000,), KEY, stream=0))
    others = [
        philox.standard_normal((50_000,), KEY, stream=1),
        philox.standard_normal((50_000,), KEY, stream=2**40),
        philox.standard_normal((50_000,), KEY + 1, stream=0),
    ]
    for b in others:
        r = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        assert abs(r) < 5 / math.sqrt(50_000), r
    # a prefix of a longer draw is the shorter draw (counter order), and the shape only arranges the numbers
    assert torch.equal(philox.standard_normal((8, 7), KEY, 5).reshape(-1), philox.standard_normal((100,), KEY, 5)[:56])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes(dtype):
    z = philox.standard_normal((4000,), KEY, 1, dtype=dtype)
    assert z.dtype == dtype and bool(torch.isfinite(z).all())
    assert torch.allclose(z.double(), philox.standard_normal((4000,), KEY, 1, dtype=torch.float64), atol=1e-2, rtol=1e-2)
    u = philox.uniform((4000,), KEY, 1, dtype=dtype)
    assert u.dtype == dtype and float(u.min()) >= 0 and float(u.max()) < 1  # exact in the dtype: never rounded up to 1
    assert abs(float(u.double().mean()) - 0.5) < 5 * math.sqrt(1 / 12 / 4000)


def test_uniform():
    u = philox.uniform((200_000,), KEY, 7).double().numpy()
    assert u.min() >= 0 and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert np.all(u * 2**24 == np.floor(u * 2**24))  # float32: 24 bits, as torch.rand
    u64 = philox.uniform((20_000,), KEY, 7, dtype=torch.float64).numpy()
    assert u64.min() >= 0 and u64.max() < 1 and stats.kstest(u64, "uniform").pvalue > 1e-3
    assert np.all(u64 * 2**53 == np.floor(u64 * 2**53)) and not np.all(u64 * 2**24 == np.floor(u64 * 2**24))


def test_a_compiled_draw_equals_the_eager_draw():
    draw = torch.compile(lambda key: philox.standard_normal((37, 11), key, 4) * 2 + philox.uniform((37, 11), key, 5))
    eager = philox.standard_normal((37, 11), KEY, 4) * 2 + philox.uniform((37, 11), KEY, 5)
    assert torch.allclose(draw(KEY), eager, rtol=1e-5, atol=1e-5)


def test_dispatch_draws_from_torch_outside_and_from_philox_inside_a_block():
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    outside = philox.randn((5,), dtype=torch.float32, device=cpu), philox.rand((3,), dtype=torch.float32, device=cpu)
    torch.manual_seed(0)
    assert torch.equal(outside[0], torch.randn(5)) and torch.equal(outside[1], torch.rand(3))
    with philox.counter_draws(KEY):
        first = philox.randn((5,), dtype=torch.float32, device=cpu)
        second = philox.rand((3,), dtype=torch.float32, device=cpu)
        with pytest.raises(RuntimeError, match="do not nest"):
            with philox.counter_draws(KEY):
                pass
    assert torch.equal(first, philox.standard_normal((5,), KEY, 0)) and torch.equal(second, philox.uniform((3,), KEY, 1))
    torch.manual_seed(0)  # the block is over: torch's generator again
    after = philox.randn((5,), dtype=torch.float32, device=cpu)
    torch.manual_seed(0)
    assert torch.equal(after, torch.randn(5))


def test_new_key_follows_torch_manual_seed():
    torch.manual_seed(4)
    a = philox.new_key()
    torch.manual_seed(4)
    assert a.dtype == torch.int64 and a.dim() == 0 and int(a) == int(philox.new_key()) and 0 <= int(a) < 2**63


def test_bad_input():
    with pytest.raises(ValueError, match="key must be a 0-d int64"):
        philox.standard_normal((3,), torch.tensor(1.0), 0)
    with pytest.raises(ValueError, match="key must be a 0-d int64"):
        philox.counter_draws(torch.tensor([1, 2])).__enter__()
    with pytest.raises(ValueError, match="stream must be an integer in"):
        philox.standard_normal((3,), KEY, -1)
    with pytest.raises(ValueError, match="shape must have sizes >= 0"):
        philox.uniform((3, -1), KEY)
    with pytest.raises(ValueError, match="dtype must be a floating-point"):
        philox.standard_normal((3,), KEY, dtype=torch.int32)
    with pytest.raises(ValueError, match="4 counter words and 2 key words"):
        philox.philox4x32(_words((0, 0, 0)), _words((0, 0)))
    with pytest.raises(ValueError, match="int64 tensors"):
        philox.philox4x32([torch.zeros(1, dtype=torch.int32)] * 4, _words((0, 0)))
    assert philox.standard_normal((0, 3), KEY).shape == (0, 3)
