"""Coil's version, in a module of its own so that what reports it (the doctor, repro scripts)
imports it without importing the ``coil`` package's ``__init__``."""

__version__ = "0.1.0"
