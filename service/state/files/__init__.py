"""The file backends, the embedded default: nothing to run beside the service.

- `chats.py`: the JSONL `ChatStore`, one file per chat (`AGW_CHAT_STORE=jsonl`).
- `run_log.py`: the `RunLog` of ended runs in one SQLite file (`AGW_RUN_LOG=files`).
- `uploads.py`: the `UploadStore`, one directory per upload (`AGW_UPLOAD_STORE=files`).

One process writes the chats and the run log; the uploads directory may be shared
(see `uploads.py`).
"""
