"""Places on a globe and the round trips between them.

Peers and clients sit at points drawn uniformly on a sphere (oceans included: a simplification).
A round trip costs twice the great-circle distance at 200,000 km/s (light in fibre), plus each
end's last-mile share; antipodes are about 200 ms apart, neighbours a few ms.

This module does not: model routes longer than the great circle, congestion, or jitter.
"""

from __future__ import annotations

import math
import random

EARTH_RADIUS_KM = 6371.0
FIBRE_KM_PER_MS = 200.0
"""Light in fibre: 200,000 km/s."""

Point = tuple[float, float, float]
"""A unit vector (x, y, z) from the Earth's centre."""


def random_point(rng: random.Random) -> Point:
    """A point drawn uniformly on the sphere (Archimedes: z uniform, longitude uniform)."""
    z = rng.uniform(-1.0, 1.0)
    phi = rng.uniform(0.0, 2.0 * math.pi)
    r = math.sqrt(1.0 - z * z)
    return (r * math.cos(phi), r * math.sin(phi), z)


def rtt_ms(a: Point, b: Point, access_a_ms: float, access_b_ms: float) -> float:
    """Round trip between two points, ms: 2 × great-circle km / 200 km per ms + both last miles."""
    dot = max(-1.0, min(1.0, a[0] * b[0] + a[1] * b[1] + a[2] * b[2]))
    return 2.0 * EARTH_RADIUS_KM * math.acos(dot) / FIBRE_KM_PER_MS + access_a_ms + access_b_ms
