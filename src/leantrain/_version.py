"""The package's version, apart from the package face: modules that print it need not import `leantrain`."""

__version__ = "0.1.0"
