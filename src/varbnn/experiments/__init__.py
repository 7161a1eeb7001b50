"""Experiment configs and the runner behind ``varbnn reproduce``."""

from varbnn.experiments.config import ExperimentConfig, Variant
from varbnn.experiments.registry import CONFIGS, get_config, register_config
from varbnn.experiments.render import render_markdown
from varbnn.experiments.runner import run_experiment

__all__ = ["ExperimentConfig", "Variant", "CONFIGS", "get_config", "register_config", "run_experiment", "render_markdown"]
