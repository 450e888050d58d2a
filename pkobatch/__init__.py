"""pkobatch: a Job-based reconciler for Pulumi stacks on Kubernetes."""

# The one place the version is written: the wheel's (pyproject.toml reads it), `pkobatch
# --version`, the default image tags; a release is the git tag v<version>, which
# pkobatch.dev.release checks against it, the chart's and CHANGELOG.md.
__version__ = "0.1.0"
