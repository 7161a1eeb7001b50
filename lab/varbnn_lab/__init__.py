"""Experiment configs and the runner behind ``varbnn reproduce``."""

from varbnn_lab.config import ExperimentConfig, Variant
from varbnn_lab.registry import CONFIGS, get_config, register_config
from varbnn_lab.render import render_markdown
from varbnn_lab.runner import run_experiment

__all__ = ["ExperimentConfig", "Variant", "CONFIGS", "get_config", "register_config", "run_experiment", "render_markdown"]
