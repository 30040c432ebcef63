# Loads the kit's pytest plugin when running from a checkout that is not
# pip-installed; when installed, the pytest11 entry point of the same name
# has already registered it and pytest skips this.
pytest_plugins = ["conformance.plugin"]
