"""pytest plugins with the fixtures every test tier shares, one module per concern; the root
``tests/conftest.py`` registers them (``pytest_plugins``) and lists them."""
