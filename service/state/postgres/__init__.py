"""The PostgreSQL backends: the state that replicas on any hosts share.

- `chats.py`: the `ChatStore` (`AGW_CHAT_STORE=postgres`).
- `run_log.py`: the `RunLog` of ended runs (`AGW_RUN_LOG=postgres`).
- `uploads.py`: the `UploadStore`, bytes included (`AGW_UPLOAD_STORE=postgres`).
- `schema.py`: what they share: the connection pool, the schema (the SQL files of
  `migrations/`, applied at start-up) and the failures reported as `StoreFailed`.
"""
