"""RFC-0186's entry point: one test, parametrized from the case DB by the casedb pytest plugin.

    pytest tests/test_model_ops.py --model granite4h -k "torch.add"
    pytest tests/test_model_ops.py --model gpt_oss -m ""          # without the default marker filter
    pytest tests/test_model_ops.py --model granite4h --no-dedupe -n 4

Without --model only a small smoke set of the default DB is collected.
"""

from casedb.pytest_plugin import test_model_op  # noqa: F401
