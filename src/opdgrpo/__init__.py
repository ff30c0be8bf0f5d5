"""opdgrpo: reproduce the compute comparison of on-policy distillation (OPD) against GRPO."""

__version__ = "0.1.0"
