"""The learning-rate range test (Smith 2017, "Cyclical Learning Rates for Training Neural
Networks"; Lightning's lr_find): train a few steps at learning rates growing geometrically from
min_lr to max_lr, stop when the loss diverges, and read a good learning rate off the curve.

The rule (suggest): smooth the losses (an exponential moving average, bias-corrected), keep the
points before the smoothed loss's minimum, and take the learning rate where the smoothed loss
falls fastest against log(lr), its slope measured over a decade of learning rates, ignoring the
first tenth of the points (the average warming up). Past the minimum the loss no longer falls;
the steepest descent sits below it, where training is fast and still stable."""

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont


@dataclass
class RangeTest:
    """The learning rates tried, their losses (raw and smoothed), why it stopped, the suggestion."""

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    stopped: str  # "diverged", "not finite" or "done"
    suggestion: float | None  # None: no descent to read (lower min_lr, or more steps)


def geometric(min_lr: float, max_lr: float, num_steps: int) -> list[float]:
    """num_steps learning rates from min_lr to max_lr, equally spaced on a log scale."""
    ratio = math.log(max_lr / min_lr)
    return [min_lr * math.exp(ratio * i / max(num_steps - 1, 1)) for i in range(num_steps)]


def run_range_test(
    step: Callable[[float], float], lrs: list[float], *, beta: float = 0.98, diverge: float = 4.0
) -> RangeTest:
    """step(lr) trains one optimizer step at lr and returns its loss; stop once the smoothed
    loss exceeds `diverge` times the best so far (for a loss that can be negative: rises above
    it by diverge - 1 times its magnitude), or a loss is not finite."""
    losses: list[float] = []
    smoothed: list[float] = []
    average, stopped = 0.0, "done"
    for lr in lrs:
        loss = step(lr)
        if not math.isfinite(loss):
            stopped = "not finite"
            break
        losses.append(loss)
        average = beta * average + (1 - beta) * loss
        smoothed.append(average / (1 - beta ** len(losses)))
        # best + (diverge - 1) x |best|: diverge x best for a positive best; for a negative
        # one, diverge x best lies below it, and a loss still falling would count as diverged.
        best = min(smoothed)
        if len(smoothed) > 1 and smoothed[-1] - best > (diverge - 1) * abs(best):
            stopped = "diverged"
            break
    tried = lrs[: len(losses)]
    return RangeTest(tried, losses, smoothed, stopped, suggest(tried, smoothed))


def suggest(lrs: list[float], smoothed: list[float]) -> float | None:
    """The learning rate of the steepest descent before the smoothed loss's minimum: slopes
    over a decade of learning rates centred on each point (a narrower window reads the noise of
    single batches), after the first tenth of the points."""
    num_points = len(smoothed)
    if num_points < 3:
        return None
    lowest = min(range(num_points), key=smoothed.__getitem__)
    per_decade = (num_points - 1) / max(math.log10(lrs[-1] / lrs[0]), 1e-12)
    half = max(1, round(per_decade / 2))
    logs = [math.log(lr) for lr in lrs]
    slopes = {
        i: (smoothed[i + half] - smoothed[i - half]) / (logs[i + half] - logs[i - half])
        for i in range(num_points // 10 + half, min(lowest, num_points - half))
    }
    if not slopes:
        return None
    steepest = min(slopes, key=slopes.__getitem__)
    return lrs[steepest] if slopes[steepest] < 0 else None


def csv_text(result: RangeTest) -> str:
    """The curve as CSV text (tune.py writes it atomically)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["lr", "loss", "smoothed_loss"])
    writer.writerows(zip(result.lrs, result.losses, result.smoothed, strict=True))
    return text.getvalue()


def draw(result: RangeTest, width: int = 640, height: int = 400) -> Image.Image:
    """The smoothed loss against the learning rate (log axis), the suggestion marked in red."""
    image = Image.new("RGB", (width, height), "white")
    canvas, font = ImageDraw.Draw(image), ImageFont.load_default()
    left, right, top, bottom = 60, width - 20, 20, height - 40
    low, high = math.log10(result.lrs[0]), math.log10(result.lrs[-1])
    floor, ceiling = min(result.smoothed), max(result.smoothed)

    def point(lr: float, loss: float) -> tuple[float, float]:
        x = left + (math.log10(lr) - low) / max(high - low, 1e-12) * (right - left)
        y = bottom - (loss - floor) / max(ceiling - floor, 1e-12) * (bottom - top)
        return x, y

    canvas.rectangle((left, top, right, bottom), outline="black")
    for decade in range(math.ceil(low), math.floor(high) + 1):  # a tick per power of ten
        x = point(10.0**decade, floor)[0]
        canvas.line((x, bottom, x, bottom + 4), fill="black")
        canvas.text((x - 12, bottom + 8), f"1e{decade}", fill="black", font=font)
    for loss in (floor, ceiling):
        canvas.text((4, point(result.lrs[0], loss)[1] - 6), f"{loss:.3g}", fill="black", font=font)
    points = [point(lr, loss) for lr, loss in zip(result.lrs, result.smoothed, strict=True)]
    canvas.line(points * (2 if len(points) == 1 else 1), fill="navy", width=2)
    if result.suggestion is not None:
        x = point(result.suggestion, floor)[0]
        canvas.line((x, top, x, bottom), fill="red", width=1)
        canvas.text((x + 4, top + 4), f"suggested {result.suggestion:.3g}", fill="red", font=font)
    canvas.text((left, height - 16), "learning rate (log scale); smoothed loss", fill="black")
    return image
