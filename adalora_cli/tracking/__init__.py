"""Experiment trackers: TensorBoard, Weights & Biases and MLflow as extra sinks.

The run directory stays the source of truth; a tracker only mirrors it so a long run can
be watched live. :func:`check_trackers` runs before training (a missing package is a
one-line error naming the extra); :class:`Trackers` fans every log call out to the
selected backends and drops one that fails or does not answer in time, with a single
warning, so a tracker never breaks or holds training.
"""

from .fanout import Trackers, check_trackers

__all__ = ["Trackers", "check_trackers"]
