"""Chats: the recorder that writes a run into its chat, the history replayed from the
records, the chat memory given to the model, and uploads."""
