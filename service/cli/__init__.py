"""The ``kgrade`` command line: one click group, one module per command family."""

from __future__ import annotations

import click

from service.cli.db import db
from service.cli.export import export
from service.cli.grade import exercises, grade_exercise
from service.cli.imports import import_cmd
from service.cli.items import items
from service.cli.lti import lti
from service.cli.serve import serve
from service.cli.token import course, token


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kgrade")
def main() -> None:
    """kgrade: quizzes, LMS exports and kernel grading for long-context attention courses."""


main.add_command(items)
main.add_command(export)
main.add_command(import_cmd)
main.add_command(db)
main.add_command(token)
main.add_command(serve)
main.add_command(grade_exercise)
main.add_command(exercises)
main.add_command(lti)
main.add_command(course)
