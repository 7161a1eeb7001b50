"""The names ``varbnn.families.gaussian`` held before it was split (kept so that old imports and old pickles of whole
models keep working): :class:`~varbnn.families.meanfield.MeanField` and its helpers now live in
:mod:`varbnn.families.meanfield`, the softplus families' speed machinery in the private :mod:`varbnn._fast.softplus`.
New code imports from those (or from :mod:`varbnn.families`)."""

from __future__ import annotations

from varbnn._fast.softplus import SOFTPLUS_THRESHOLD as SOFTPLUS_THRESHOLD
from varbnn._fast.softplus import ScaleStats as ScaleStats
from varbnn._fast.softplus import (
    SoftplusGroup,
    cache_until_backward,
    cached_softplus,
    fused_sample,
    group_stats,
    join_softplus_groups,
    normal_kl_from_stats,
    plain_stats,
    softplus_sample,
    softplus_stats,
    stats_per_step,
    step_key,
)
from varbnn._fast.softplus import cached_draw as cached_draw
from varbnn._fast.softplus import fused_normal_kl as fused_normal_kl
from varbnn._fast.softplus import share_sigmas_in_trace as share_sigmas_in_trace
from varbnn._fast.softplus import softplus as softplus
from varbnn.families.meanfield import INIT_STD_RANGE, MeanField, inverse_softplus, normal_kl_elementwise

__all__ = [
    "MeanField",
    "INIT_STD_RANGE",
    "inverse_softplus",
    "cached_softplus",
    "stats_per_step",
    "step_key",
    "cache_until_backward",
    "plain_stats",
    "softplus_stats",
    "fused_sample",
    "softplus_sample",
    "SoftplusGroup",
    "join_softplus_groups",
    "group_stats",
    "normal_kl_from_stats",
    "normal_kl_elementwise",
]

