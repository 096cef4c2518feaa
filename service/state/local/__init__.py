"""The in-process backends: one process's state in its own dicts, kept by nothing else.

- `stores.py`: the in-process `ChatStore`, `RunLog` and `UploadStore` (the setting
  value `memory` of `AGW_CHAT_STORE`, `AGW_RUN_LOG`, `AGW_UPLOAD_STORE`): nothing
  survives the process; for tests and trying the service out.
- `bus.py`: the in-process `RunBus` (`AGW_RUN_BUS=local`, the default): the runs of
  this process, for one process.
"""
