"""The Jupyter kernel the course installs: IPython's own, except that it does not report the Python version.

Why: when a kernel starts, JupyterLab writes the kernel's ``language_info`` into the notebook's metadata, and
marks the notebook changed unless the two are equal. IPython's kernel reports the exact Python version
(``"version": "3.11.7"``), which no committed notebook can match on every learner's machine, so every untouched
lesson asked "Save your work?" when closed. This kernel reports :data:`LANGUAGE_INFO`, the same on every machine,
and every notebook of the course carries exactly that (``tests/test_lab_kernel.py``); it is installed under the
name and display name the notebooks carry (:data:`KERNELSPEC`), so JupyterLab keeps their kernelspec too.

    python -m flashcourse.lab_kernel install --sys-prefix   # what `make lab` runs: the kernel of this venv
    python -m flashcourse.lab_kernel -f CONNECTION_FILE     # what Jupyter runs (the kernel spec's argv)

A notebook opened with IPython's plain kernel still runs the same; only closing it asks to save.

Two more things a learner would otherwise meet at the start:

- the install also writes the course's JupyterLab settings (:data:`LAB_SETTINGS`: no "news" pop-up asking to fetch
  Jupyter's news feed, no update check) as ``share/jupyter/lab/settings/overrides.d/flashcourse.json`` under the
  prefix: defaults, which a learner can still change in Settings, and which leave the user's own
  ``overrides.json`` alone;
- JupyterLab serves nothing above the folder it was started in, so a lesson's link to ``../exercises/`` does
  nothing, silently, when it was started inside ``notebooks/``. The kernel finds the server's folder (the
  ``jpserver-<pid>.json`` file its parent server wrote beside the kernel's connection file) and, in that case,
  says why above the first cell's output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__" and sys.path[0] in ("", str(Path.cwd())):
    # As ipykernel's own launcher does: the folder Jupyter starts the kernel in (the notebook's) leaves the path
    # while the kernel loads, so a learner's file there cannot stand in for a module the kernel imports; IPython
    # puts it back, as "", before the first cell runs.
    del sys.path[0]

from ._extras import missing

try:
    from ipykernel import kernelspec
    from ipykernel.ipkernel import IPythonKernel
except ImportError as error:  # JupyterLab brings ipykernel: the course extra
    raise missing("course", "ipykernel", __name__) from error

# What IPython's kernel reports, less "version". The notebooks' metadata holds this dict exactly.
LANGUAGE_INFO = {
    "codemirror_mode": {"name": "ipython", "version": 3},
    "file_extension": ".py",
    "mimetype": "text/x-python",
    "name": "python",
    "nbconvert_exporter": "python",
    "pygments_lexer": "ipython3",
}
# The kernelspec metadata JupyterLab writes for this kernel: "python3" is also the name nbclient, nbgrader and
# the grader ask for, so they run the notebooks on this kernel where it is installed, and on IPython's elsewhere.
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
# JupyterLab's settings for the course, by plugin id, as in an overrides file. "fetchNews": "none" (JupyterLab's
# default) asks in a pop-up at every fresh start whether to fetch news from the internet; the course answers no.
LAB_SETTINGS = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}
SETTINGS_FILE = Path("share", "jupyter", "lab", "settings", "overrides.d", "flashcourse.json")


def server_root(server_pid: int, runtime_dir: Path) -> Path | None:
    """The folder the Jupyter server ``server_pid`` serves, from the file it writes into its runtime folder (the one
    that also holds the kernel's connection file), or None when there is no such server."""
    try:
        info = json.loads((runtime_dir / f"jpserver-{server_pid}.json").read_text())
        return Path(info["root_dir"]).expanduser()
    except (OSError, ValueError, KeyError, TypeError):
        return None


def links_notice(notebook_folder: Path, root: Path | None) -> str:
    """What to say when the server was started inside the notebook's own folder of the course (``notebooks/`` or
    ``exercises/``), where the links between lessons and exercises cannot open; "" otherwise."""
    if root is None or notebook_folder.resolve() != root.resolve():
        return ""
    course, folders = root.resolve().parent, ("notebooks", "exercises")
    if root.name not in folders or not all((course / folder).is_dir() for folder in folders):
        return ""
    return (f"Note: JupyterLab was started inside {root.name}/, and it opens nothing above that folder, so the links "
            f"to ../exercises/ and ../notebooks/ do nothing. Stop it (Ctrl-C in its terminal) and start it from "
            f"{course}: `make lab`, or `jupyter lab --LabApp.default_url=/lab/tree/notebooks` there.")


def not_run_notice(failed_cell: int) -> str:
    """What a code cell says when an error in an earlier cell kept Run All from running it."""
    return (f"Not run: Run All stopped at the error in cell [{failed_cell}] above. Scroll up to that cell: its "
            "message says what to fix. Then run it again, and the cells after it.")


class CourseKernel(IPythonKernel):
    """IPython's kernel with a ``language_info`` that is the same on every machine; it also says, above the first
    cell's output, when the links between lessons and exercises cannot open (:func:`links_notice`), and, in each
    cell that Run All skipped after an error, where that error is (:func:`not_run_notice`)."""

    language_info = LANGUAGE_INFO

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        connection_file = getattr(self.parent, "abs_connection_file", "")  # in the server's runtime folder
        notice = links_notice(Path.cwd(), server_root(os.getppid(), Path(connection_file).parent)) \
            if connection_file else ""
        if notice and self.shell is not None:
            def say_once(*_):
                print(notice)
                self.shell.events.unregister("pre_run_cell", say_once)

            self.shell.events.register("pre_run_cell", say_once)

    def _send_abort_reply(self, stream, msg, idents):
        # After an error, ipykernel answers every queued execute request "aborted" and JupyterLab leaves those cells
        # blank, while Run All has scrolled to the last one: the error is off screen. Each skipped code cell now
        # says where it is (ipykernel's own method, extended: it sends one reply per skipped request).
        code = (msg.get("content") or {}).get("code", "")
        if self.session is not None and msg["header"]["msg_type"] == "execute_request" and code.strip():
            failed = self.shell.execution_count - 1  # the count the failed cell showed
            self.session.send(self.iopub_socket, "stream", {"name": "stdout", "text": not_run_notice(failed) + "\n"},
                              parent=msg, ident=self._topic("stream"))
        super()._send_abort_reply(stream, msg, idents)


def install_lab_settings(prefix: str) -> Path:
    """Write :data:`LAB_SETTINGS` where JupyterLab of the environment at ``prefix`` reads override files."""
    path = Path(prefix) / SETTINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(LAB_SETTINGS, indent=1) + "\n")
    return path


def install(*, user: bool = False, prefix: str | None = None) -> str:
    """Install the kernel spec under :data:`KERNELSPEC`'s name, replacing one of that name: into ``prefix``
    (``sys.prefix`` for a venv), else the user's Jupyter folder with ``user``, else the system's. Returns the
    folder written. With a prefix, the course's JupyterLab settings go there too (:func:`install_lab_settings`):
    JupyterLab reads them from its environment's prefix only, not from the user's Jupyter folder."""
    # IPython's own install (this Python, its options), then the module it starts is this one.
    folder = kernelspec.install(user=user, prefix=prefix, kernel_name=KERNELSPEC["name"],
                                display_name=KERNELSPEC["display_name"])
    spec_file = Path(folder) / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["argv"][spec["argv"].index("ipykernel_launcher")] = __spec__.name
    spec_file.write_text(json.dumps(spec, indent=1) + "\n")
    if prefix is not None:
        install_lab_settings(prefix)
    return folder


def main(args: list[str]) -> None:
    if args[:1] != ["install"]:
        from ipykernel.kernelapp import IPKernelApp

        IPKernelApp.launch_instance(args, kernel_class=CourseKernel)
        return
    parser = argparse.ArgumentParser(prog="python -m flashcourse.lab_kernel install",
                                     description="Install the course's Jupyter kernel as 'Python 3' (python3).")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sys-prefix", action="store_true", help="into this Python's environment (a venv, conda)")
    where.add_argument("--user", action="store_true", help="into your own Jupyter folder")
    where.add_argument("--prefix", help="into PREFIX/share/jupyter/kernels")
    options = parser.parse_args(args[1:])
    folder = install(user=options.user, prefix=sys.prefix if options.sys_prefix else options.prefix)
    print(f"installed the kernel {KERNELSPEC['display_name']!r} ({KERNELSPEC['name']}) in {folder}")
    if options.sys_prefix or options.prefix:
        print(f"and the course's JupyterLab settings (no news pop-up) in "
              f"{Path(sys.prefix if options.sys_prefix else options.prefix) / SETTINGS_FILE}")


if __name__ == "__main__":
    main(sys.argv[1:])
