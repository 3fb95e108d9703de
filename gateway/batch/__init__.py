"""OpenAI's Files and Batch APIs: uploaded files on disk, batches in SQLite, and the
runner that feeds batch lines through the online endpoints at the lowest priority.

Beside the edge, like the console: ``routes.py`` is a plain FastAPI router;
``runner.py`` runs each line through the same ``Endpoint`` (parse, front-door admission
charged to the batch's key, the one service call, the body) an online request uses.
"""
