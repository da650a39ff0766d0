"""What every layer of the project uses: checks that name the bad value, atomic files and the
offline cache, plug-in loading, and the offline model files (below `cory_env`; imports none)."""

from .packages import warn_on_clash

warn_on_clash()  # one line per top-level name another package took; nothing otherwise
