"""taskherd: Celery workers on Kubernetes that never lose a task and never repeat a side effect.

Kept import-light: `taskherd probe` runs every few seconds in every pod and must not pay for Celery.
"""
import os as _os

# In a source checkout (editable install) `taskherd.operator` lives under operator/taskherd/;
# an installed wheel has it beside this file and the directory below does not exist.
_checkout_operator_root = _os.path.join(_os.path.dirname(__file__), "..", "..", "operator", "taskherd")
if _os.path.isdir(_checkout_operator_root):
    __path__.append(_os.path.normpath(_checkout_operator_root))
