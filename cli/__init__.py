"""The ``cocos`` command line: typer commands that parse, call the library and print."""
