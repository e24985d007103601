"""topologies/calibration.py: a topology's calibration parsed into typed fields, written back unchanged."""

from __future__ import annotations

import copy

import pytest
import yaml

from paracube.calibration.calibrate import build_calibration, calibrated_topology, machine_info, write_topology
from paracube.cli.main import main
from paracube.cost_models.device_model import gemm_model
from paracube.errors import ParacubeError
from paracube.topologies import load_topology
from paracube.topologies.calibration import Calibration
from paracube.topologies.calibration_sections import CommFit
from tests.test_calibration import _synthetic_result


def _written() -> dict:
    """A calibration as `paracube calibrate` writes it, with the probe fit and its probes."""
    cal = build_calibration(_synthetic_result(), machine_info(4, "gloo"))
    cal["comm_alternating"] = {"all_reduce": {"4": {"latency": 5e-4, "bandwidth": 2e8, "rms_rel_err": 0.1}}}
    cal["elementwise"]["op_overhead_by_mode"] = {"fp32": {"1d": 1e-5, "2d": 2e-5}, "bf16": {"1d": 3e-5}}
    cal["probes"] = [{"layout": "dp=4", "dtype": "fp32", "seq_len": 16, "ops": 1234, "time_s": 0.1, "cpu_s": 0.09,
                      "round_times_s": [0.1, 0.1]}]
    return cal


def test_written_calibration_round_trips_through_the_yaml_file(tmp_path) -> None:
    cal = _written()
    path = write_topology(calibrated_topology("local-cpu", 4, cal), tmp_path / "c.yaml")
    back = load_topology(str(path), gpus=4).calibration
    assert isinstance(back, Calibration)
    assert back.to_dict() == cal
    assert yaml.safe_load(path.read_text())["calibration"] == cal  # the file holds the same YAML shape
    assert Calibration.from_dict(back.to_dict()) == back


def test_typed_fields_carry_what_the_cost_model_reads() -> None:
    cal = Calibration.from_dict(_written())
    assert cal.machine is not None and cal.machine.nproc == 4
    assert cal.timing is not None and cal.timing.basis == "wall"
    assert cal.gemm is not None and cal.gemm.eff_max == 1.0
    fits = {(f.kind, f.n, f.alternating): f for f in (cal.comm or ()) + (cal.comm_alternating or ())}
    assert fits[("all_reduce", 4, True)] == CommFit("all_reduce", 4, True, 5e-4, 2e8, 0.1)
    assert fits[("all_gather", 2, False)].latency == pytest.approx(200e-6, rel=1e-6)
    table = cal.comm_table()
    assert ("all_reduce", 4, True, 5e-4, 2e8) in table and len(table) == 3 * 2 + 1
    assert cal.op_overheads("fp16") == {"1d": 3e-5}  # fp16 dispatches like bf16
    assert cal.probes is not None and cal.probes[0].ops == 1234
    # The GEMM model gets the same numbers from a parsed calibration and from its mapping.
    topo = calibrated_topology("local-cpu", 4, _written())
    g = gemm_model(topo, "fp32")
    assert g.comm == table and g.op_cost("2d") == 2e-5 and g.op_overhead == cal.elementwise.op_overhead_s


def test_partial_calibrations_keep_the_defaults() -> None:
    cal = Calibration.from_dict({"gemm": {"m0": 32}})
    assert cal.gemm is not None and cal.gemm.m0 == 32.0 and cal.gemm.n0 is None
    assert cal.comm is None and cal.comm_table() == () and cal.op_overheads("fp32") == {}
    assert cal.to_dict() == {"gemm": {"m0": 32.0}}
    assert Calibration.from_dict({"link": {"latency": "3e-6", "bandwidth": "1e9"}}).link.latency == 3e-6


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c["comm"]["all_reduce"]["4"].update(latency="fast"),
     "field calibration.comm.all_reduce.4.latency: expected a number >= 0, got 'fast'"),
    (lambda c: c["comm"]["all_reduce"]["4"].pop("bandwidth"),
     "field calibration.comm.all_reduce.4.bandwidth: missing; expected a number"),
    (lambda c: c["comm"].update(gather={}), "field calibration.comm.gather: expected a collective kind"),
    (lambda c: c["comm"]["all_gather"].update(two={"latency": 1, "bandwidth": 1}),
     "field calibration.comm.all_gather.two: expected a group size"),
    (lambda c: c["gemm"].update(m0=-1.0), "field calibration.gemm.m0: expected a number > 0, got -1.0"),
    (lambda c: c["link"].update(bandwidth=0), "field calibration.link.bandwidth: expected a number > 0, got 0"),
    (lambda c: c["timing"].update(basis="gpu"), "field calibration.timing.basis: expected wall or cpu, got 'gpu'"),
    (lambda c: c["machine"].update(nproc="four"),
     "field calibration.machine.nproc: expected a positive integer, got 'four'"),
    (lambda c: c["elementwise"]["op_overhead_by_mode"]["fp32"].update({"1d": None}),
     "field calibration.elementwise.op_overhead_by_mode.fp32.1d: expected a number >= 0, got None"),
    (lambda c: c["probes"][0].pop("layout"), "field calibration.probes[0].layout: expected a string, got None"),
    (lambda c: c.update(axes={}), "field calibration.axes: unknown; valid: schema, created, machine"),
    (lambda c: c.update(gemm=[1, 2]), "field calibration.gemm: expected a mapping, got [1, 2]"),
])
def test_malformed_calibration_is_one_line_naming_the_field(tmp_path, edit, message: str) -> None:
    cal = _written()
    path = write_topology(calibrated_topology("local-cpu", 4, copy.deepcopy(cal)), tmp_path / "bad.yaml")
    data = yaml.safe_load(path.read_text())
    edit(data["calibration"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ParacubeError) as exc:
        load_topology(str(path))
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"{path}: {message}")


def test_cli_refuses_a_malformed_calibration_with_exit_2(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # `plan` writes plan.json here: a checkout's own plan.json must not decide the error
    cal = _written()
    cal["link"]["latency"] = "slow"
    data = calibrated_topology("local-cpu", 4, _written()).to_dict()
    data["calibration"] = cal
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["plan", "--cluster", str(path), "--gpus", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "field calibration.link.latency: expected a number >= 0" in err
