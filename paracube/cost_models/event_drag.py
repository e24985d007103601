"""The event engine's side of the overlap drag (cost_models/overlap_drag.py): which asynchronous collectives drag
the compute stream, the compute side's idle time that absorbs it, and paying the debt.

`Drag` is a mixin of event_sim.Sim (it reads the simulation's layout, topology, environment and stage stats).
"""

from __future__ import annotations

from typing import Any

import simpy

from paracube.cost_models.overlap_drag import nvlink_share


class Drag:
    """event_sim.Sim's drag bookkeeping."""

    drag: float
    _drags: dict[tuple[str, ...], float]
    layout: Any
    topo: Any
    env: simpy.Environment
    stages: list

    def drag_of(self, axes: tuple[str, ...]) -> float:
        """D x f of an asynchronous collective over `axes` (overlap_drag.py): the data-parallel stream's
        (Layout.data_axes / zero_axes: not HSDP's replica all-reduce), 0 for any other."""
        if not self.drag or axes not in (self.layout.data_axes, self.layout.zero_axes):
            return 0.0
        if axes not in self._drags:
            dpn = int(getattr(self.topo, "devices_per_node", 0) or 0)
            self._drags[axes] = self.drag * nvlink_share(self.layout.groups(axes)[0], dpn)
        return self._drags[axes]

    def idle(self, stage: int, event: simpy.Event):
        """Wait for `event`, the compute side idle meanwhile (it absorbs the drag: overlap_drag.py)."""
        st = self.stages[stage]
        st.idle_since = self.env.now
        yield event
        st.idle += self.env.now - st.idle_since
        st.idle_since = None

    def pay(self, stage: int):
        """Run the compute seconds the stage owes to the drag (overlap_drag.py), if any."""
        st = self.stages[stage]
        if st.debt > 0:
            debt, st.debt = st.debt, 0.0
            st.flow(self.env.now)
            st.busy_since = self.env.now
            yield self.env.timeout(debt)
            st.flow(self.env.now)
            st.busy += debt
            st.busy_since = None


__all__ = ["Drag"]
