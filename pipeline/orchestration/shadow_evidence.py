"""`tfship promote ... --evidence shadow`: judge a candidate on the live shadow report of a running server.

The report (`serving.dataplane.shadow_report`) compared the candidate, served as the model's shadow, with the
version answering clients, pair by pair with the gate's rules. A label moves only when the report meets every
floor (`serving.dataplane.shadow_report.check_floors`): at least `min_pairs` pairs, every one answered by the
candidate, top-1 agreement and value agreement at their floors, and no shadow error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tfship.serving.dataplane.shadow_report import check_floors


@dataclass(frozen=True)
class ShadowEvidence:
    """A shadow report and the floors it must meet. Agreements are fractions in [0, 1]; `source` is where the
    report was read (a server address or a folder), recorded with the promotion.
    """

    report: dict[str, Any]
    source: str
    min_pairs: int = 100
    min_top1_agreement: float = 0.99
    min_value_agreement: float = 0.0

    def reasons(self, version: int) -> list[str]:
        """Why the report does not prove `version`; empty when it does."""
        return check_floors(self.report, version, self.min_pairs, self.min_top1_agreement, self.min_value_agreement)

    def summary(self) -> str:
        """The report's figures in one line (pairs, agreements, max error per output, errors)."""
        figures = self.report["figures"]
        top1, value = figures["top1_agreement"], figures["value_agreement"]
        outputs = sorted((name, entry["max_error"]) for name, entry in figures["outputs"].items())
        errors = ", ".join(f"{name} {value:.3g}" for name, value in outputs)
        return (f"shadow report ({self.source}): {figures['pairs']} pairs, top-1 agreement "
                f"{'-' if top1 is None else f'{top1:.2%}'}, value agreement {'-' if value is None else f'{value:.2%}'}"
                f", max |diff| {errors or '-'}, shadow errors {figures['shadow_errors']}, dropped {figures['dropped']}")

    def record(self, version: int) -> dict[str, Any]:
        """What the promotion history keeps: kind, source, floors, figures, verdict and its reasons."""
        reasons = self.reasons(version)
        return {"kind": "shadow", "source": self.source, "floors": {
                    "min_pairs": self.min_pairs, "min_top1_agreement": self.min_top1_agreement,
                    "min_value_agreement": self.min_value_agreement},
                "figures": self.report["figures"], "errors": self.report.get("errors", {}),
                "passed": not reasons, "reasons": reasons, "summary": self.summary()}
