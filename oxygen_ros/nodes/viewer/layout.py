"""The live view's entity paths and panel layout (a Rerun blueprint); ROS-free.

Panels, top to bottom: one camera panel per model image slot (`cameras/<slot>`); the task
(instructions, episode phase and result), the language requests streaming, the event log
(instructions, finished subtasks and narrations, episode phases) and the memory entries; one
plot per joint group (`arms/<group>`: each joint's commanded target and measured position),
the action and frame rates and the inference timings.

Invariants:
- Every path the node logs to is built here, so the layout and the data cannot drift.
- Plots show the last `PLOT_WINDOW_S` of the `stamp` timeline (the messages' header stamps:
  sim time in the workcell), which the time panel selects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import rerun.blueprint as rrb

TIMELINE = "stamp"  # the messages' header stamps
PLOT_WINDOW_S = 20.0
TASK = "task"
LANGUAGE = "language"
EVENTS = "events"
MEMORY = "memory"
RATES = "rates"
TIMING = "timing"
# The series a joint group's plot shows, per joint: its commanded target and its measured
# position (same colour, the command thinner).
COMMANDED, MEASURED = "commanded", "measured"
PALETTE = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)


def camera_path(slot: str) -> str:
    return f"cameras/{slot}"


def arm_path(group: str, series: str) -> str:
    return f"arms/{group}/{series}"


def rate_path(name: str) -> str:
    return f"{RATES}/{name}"


def timing_path(name: str) -> str:
    return f"{TIMING}/{name}"


def event_path(kind: str) -> str:
    return f"{EVENTS}/{kind}"


def series_colors(count: int) -> list[tuple[int, int, int]]:
    return [PALETTE[i % len(PALETTE)] for i in range(count)]


def blueprint(slots: Sequence[str], groups: Mapping[str, Sequence[str]]) -> rrb.Blueprint:
    """The view's panels for these image slots and joint groups."""
    window = rrb.VisibleTimeRange(
        TIMELINE,
        start=rrb.TimeRangeBoundary.cursor_relative(seconds=-PLOT_WINDOW_S),
        end=rrb.TimeRangeBoundary.cursor_relative(),
    )
    cameras = [rrb.Spatial2DView(origin=camera_path(s), name=s) for s in slots]
    arms = [
        rrb.TimeSeriesView(
            origin=f"arms/{g}",
            name=f"{g}: commanded (thin) vs measured, hover for the joint",
            time_ranges=window,
            plot_legend=rrb.PlotLegend(visible=False),  # 2 x 7 names would hide the lines
        )
        for g in groups
    ]
    text = rrb.Horizontal(
        rrb.Vertical(
            rrb.TextDocumentView(origin=TASK, name="task"),
            rrb.TextDocumentView(origin=LANGUAGE, name="language: newest of each kind"),
        ),
        rrb.TextLogView(origin=EVENTS, name="events"),
        rrb.TextLogView(origin=MEMORY, name="memory"),
        column_shares=[2, 2, 1],
    )
    plots = rrb.Horizontal(
        *arms,
        rrb.Vertical(
            rrb.TimeSeriesView(origin=RATES, name="rates (Hz)", time_ranges=window),
            rrb.TimeSeriesView(origin=TIMING, name="inference (ms)", time_ranges=window),
        ),
    )
    rows = [rrb.Horizontal(*cameras)] if cameras else []
    return rrb.Blueprint(
        rrb.Vertical(*rows, text, plots, row_shares=[4, 3, 3] if cameras else [1, 1]),
        rrb.TimePanel(timeline=TIMELINE, state="collapsed"),
        rrb.BlueprintPanel(state="collapsed"),
        rrb.SelectionPanel(state="collapsed"),
    )
