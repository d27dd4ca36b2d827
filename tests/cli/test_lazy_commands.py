"""The command line's lazy seam (`tracedb.cli.main.COMMANDS`): `--help` lists every command from the
table without importing a command module, and each entry names a command whose own short help is
the table's."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from tracedb.cli import main
from tracedb.cli.main import COMMANDS, TRACE_COMMANDS

from tests.fresh_python import run_fresh


def _stand_in(name: str, summary: str) -> click.Command:
    return click.Command(name, help=summary)


@pytest.mark.parametrize("group, table", [((), COMMANDS), (("trace",), TRACE_COMMANDS)])
def test_each_entry_names_a_command_whose_short_help_is_the_tables(group, table):
    parent = main
    for name in group:
        parent = parent.get_command(None, name)
    for name, (where, summary) in table.items():
        cmd = parent.get_command(None, name)
        assert isinstance(cmd, click.Command), name
        assert cmd.name == name, (name, where)
        # At every width the listing may give it, the command's own short help and the table's agree.
        for limit in (30, 45, 80, 10_000):
            assert cmd.get_short_help_str(limit) == _stand_in(name, summary).get_short_help_str(limit), (name, limit)


def test_the_listing_is_the_one_click_makes_from_the_commands_themselves():
    # In a new interpreter (none loaded yet): the lazy listing, then click's own once every
    # command is loaded, are the same text.
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from tracedb.cli import main\n"
        "from tracedb.cli.main import COMMANDS\n"
        "lazy = CliRunner().invoke(main, ['--help']).output\n"
        "assert 'tracedb.cli.maintenance' not in sys.modules\n"
        "for name in COMMANDS:\n"
        "    main.get_command(None, name)\n"
        "loaded = CliRunner().invoke(main, ['--help']).output\n"
        "print(lazy == loaded, '  verify      Check everything; exit 4 on any damage.' in lazy)\n"
    )
    assert run_fresh(code) == ["True", "True"]


def test_help_imports_no_command_module_and_a_command_imports_its_own():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from tracedb.cli import main\n"
        "mods = ('read', 'maintenance', 'replay', 'serve', 'interop', 'ui', 'demo')\n"
        "def loaded():\n"
        "    return ','.join(m for m in mods if 'tracedb.cli.' + m in sys.modules) or '-'\n"
        "for args in (['--help'], ['trace', '--help'], ['stats', '--help'], ['trace', 'diff', '--help']):\n"
        "    r = CliRunner().invoke(main, args)\n"
        "    assert r.exit_code == 0, r.output\n"
        "    print(loaded())\n"
    )
    assert run_fresh(code) == ["-", "-", "read", "read,replay"]


def test_an_unknown_command_is_a_usage_error():
    r = CliRunner().invoke(main, ["inspcet"])
    assert r.exit_code == 2 and "No such command 'inspcet'" in r.output
