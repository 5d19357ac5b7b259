"""The command line, the top stage: ``python -m rpka COMMAND`` and the report's driver.

Parses each command's options, checks them, runs the stage below that does the work and
says how it stopped (SIGINT / SIGTERM, a full disk). ``commands`` holds every command;
``longrange`` the long-range study's; ``args`` their options and checks; ``signals`` how a
command stops; ``report_lock`` one report per preset at a time; ``pipeline`` runs the
notebooks with papermill and renders the HTML report.

May import: every other stage (it is the top layer); nothing imports it but
``rpka.__main__``.
"""

from rpka import numerics

numerics.pin()  # a study stage: pinned CPU numerics before torch runs (rpka.numerics)
