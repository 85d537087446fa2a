"""The desktop app (customtkinter): a client of the `onetrainer` library that edits one config and runs it."""
