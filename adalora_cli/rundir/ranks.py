"""A finished AdaLoRA run's final ranks, as another run reads them: LoRA on AdaLoRA's ranks
(``lora.rank_pattern``, docs/maths.md#lora-on-adaloras-ranks) trains each matrix at the rank
AdaLoRA kept for it.

Only what the source run wrote is read (config.yaml, status.json, summary.json,
rank_pattern.json), and each way it can be the wrong run is refused in one line: not a run,
not AdaLoRA, not finished, or without a final pattern. A finished LoRA run on such ranks is
read as its source is (its rank_pattern.json holds the same ranks), so it loads for export
or evaluation without that run. Whether its matrices are this model's
is for the builder to say, which holds the model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError, flatten, read_yaml
from .layout import CONFIG, RANK_PATTERN, SUMMARY
from .run import is_finished, resume_command


@dataclass(frozen=True)
class RankSource:
    """The final ranks of one finished AdaLoRA run."""

    path: Path
    pattern: dict[str, int]
    """``{module path: final rank}``, rank 0 for a matrix AdaLoRA pruned whole."""
    sha256: str
    """Of rank_pattern.json's bytes: what a run trained from records it."""
    model: str
    """The source run's ``model.name_or_path``, to name in a refusal."""

    @property
    def budget(self) -> int:
        """b(T): the ranks kept at the end, summed."""
        return sum(self.pattern.values())


def read_rank_source(path: str | Path) -> RankSource:
    """The final ranks of the finished AdaLoRA run in ``path``; a one-line ConfigError for
    any other directory."""
    run = Path(path).expanduser()
    key = f"lora.rank_pattern={path}"
    fix = "name a finished AdaLoRA run's directory"
    if not (run / CONFIG).is_file():
        raise ConfigError(f"{key} is not a run directory (no {CONFIG}); {fix}")
    values = flatten(read_yaml(run / CONFIG))
    method = values.get("method.name")
    # a finished LoRA run on such ranks holds them too (its rank_pattern.json is its
    # source's, as the digest it recorded says): how it is loaded without its source run
    on_ranks = method == "lora" and values.get("lora.rank_pattern") is not None
    if method != "adalora" and not on_ranks:
        raise ConfigError(f"{key} is a {method} run, not an AdaLoRA one; {fix}")
    if not is_finished(run):
        raise ConfigError(f"{key} is an unfinished run (no {SUMMARY}): its ranks are not final; "
                          f"finish it ({resume_command(run)}) or {fix}")
    file = run / RANK_PATTERN
    if not file.is_file():
        raise ConfigError(f"{key} has no {RANK_PATTERN}: AdaLoRA without pruning "
                          "(adalora.prune=false) keeps every rank; name a run that pruned")
    raw = file.read_bytes()
    try:
        pattern = json.loads(raw)
    except ValueError:
        pattern = None
    if not (isinstance(pattern, dict) and pattern and all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0
            for r in pattern.values())):
        raise ConfigError(f"{file} is not a rank pattern ({{module path: rank >= 0}}); "
                          f"{fix} whose files are intact")
    return RankSource(run, pattern, hashlib.sha256(raw).hexdigest(),
                      str(values.get("model.name_or_path")))
