"""The reference design of issue 13 ("the design described above"): a lean, batched webhook
order service written as a measuring instrument, so that it and tradecore can be measured on
the same machine, in the same sitting, by the same load client (``run.py --design
reference``). Not product code: plain functions and dicts, no layers.

* ``api``: the API process (intake, the group-committed intent + audit write, the reply);
* ``worker``: the worker host (dispatcher, per-user execution, batched result + book write,
  replies, fill verification, recovery);
* ``stack``: ``ReferenceStack``, the throwaway database, Redis database, accounts and the
  two processes, in place of ``stack.Stack``.
"""
