"""The witness's random geometry: token codes (a spread-out spherical code, deterministic for a seeded generator)
and random maps with orthonormal columns."""

from __future__ import annotations

# spherical_code's results by (n, dim, steps, generator state): every witness and decoy variant of every family
# draws the same code from the same seed, and the repulsion is ~1.2 s of CPU a call (issue #21: 9 calls a row).
_CODES: dict[tuple, object] = {}


def spherical_code(n: int, dim: int, gen, steps: int = 300):
    """``n`` unit vectors in ``dim`` dims, spread apart by a short repulsion (deterministic for a seeded gen).
    Computed once per process for a given generator state; ``gen`` always advances as the draw moves it."""
    import torch

    key = (n, dim, steps, gen.get_state().numpy().tobytes())
    x = torch.randn(n, dim, generator=gen, dtype=torch.float64)  # drawn even when known: gen moves as it always did
    if key in _CODES:
        return _CODES[key].clone()
    _CODES[key] = code = _repel(x, steps)
    return code.clone()


def _repel(x, steps: int):
    import torch

    x = x / x.norm(dim=1, keepdim=True)
    eye = torch.eye(x.shape[0], dtype=torch.bool)
    with torch.enable_grad():  # callers build weights under no_grad
        x.requires_grad_(True)
        opt = torch.optim.Adam([x], lr=0.02)
        for _ in range(steps):
            u = x / x.norm(dim=1, keepdim=True)
            cos = (u @ u.T).masked_fill(eye, -1.0)
            loss = torch.logsumexp(12.0 * cos, dim=1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        u = x / x.norm(dim=1, keepdim=True)
    return u.detach().float()


def code_margin(codes) -> float:
    """1 - the largest cosine between two different codes (the decoding margin per unit of signal)."""
    cos = codes @ codes.T
    cos.fill_diagonal_(-1.0)
    return float(1.0 - cos.max())


def orthogonal_columns(n: int, m: int, gen):
    """An n x m matrix with orthonormal columns (n >= m)."""
    import torch

    q, _ = torch.linalg.qr(torch.randn(n, m, generator=gen))
    return q[:, :m]
