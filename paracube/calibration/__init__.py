"""Calibration: microbenchmarks on local ranks, scipy fits of the cost model, a calibrated topology file."""

from paracube.calibration.calibrate import calibrate, calibrated_topology, check_calibration, write_topology
from paracube.calibration.fit import Fit, fit_alpha_beta, fit_elementwise, fit_gemm

__all__ = ["Fit", "calibrate", "calibrated_topology", "check_calibration", "fit_alpha_beta", "fit_elementwise",
           "fit_gemm", "write_topology"]
