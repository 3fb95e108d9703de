"""Uploaded and output files: content under ``<batch.directory>/files/<id>``, metadata
in the batch database. Writes go to a temporary name first and are renamed into place,
so a reader (another replica) never sees half a file.

Owned by the app; holds no state of its own beyond the directory's path.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import BinaryIO

from gateway.batch.objects import FileObject, NotFound, new_id
from gateway.batch.store import BatchState
from gateway.errors import RequestTooLarge

_CHUNK = 1024 * 1024


class FileStore:
    def __init__(self, directory: Path, state: BatchState, max_bytes: int) -> None:
        self.directory = directory / "files"
        self.state = state
        self.max_bytes = max_bytes

    def _path(self, file_id: str) -> Path:
        return self.directory / file_id

    def too_large(self) -> RequestTooLarge:
        return RequestTooLarge(
            f"file is larger than batch.max_file_bytes ({self.max_bytes} bytes)", param="file"
        )

    async def upload(self, owner: str, purpose: str, filename: str, source: BinaryIO) -> FileObject:
        """Copy an uploaded file in (refusing it past ``max_bytes``) and record it."""
        file_id = new_id("file")
        size = await asyncio.to_thread(self._copy, source, file_id)
        file = FileObject(file_id, owner, purpose, filename, size, int(time.time()))
        await self.state.add_file(file)
        return file

    async def write(self, owner: str, purpose: str, filename: str, data: bytes) -> FileObject:
        """A file the gateway made (a batch's output or error file)."""
        file_id = new_id("file")
        await asyncio.to_thread(self._write, file_id, data)
        file = FileObject(file_id, owner, purpose, filename, len(data), int(time.time()))
        await self.state.add_file(file)
        return file

    async def get(self, owner: str, file_id: str) -> FileObject:
        file = await self.state.file(file_id)
        if file is None or file.owner != owner:
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        return file

    async def content(self, file: FileObject) -> bytes:
        try:
            return await asyncio.to_thread(self._path(file.id).read_bytes)
        except FileNotFoundError:
            raise NotFound(f"No content for File object: {file.id}", param="file_id") from None

    async def delete(self, file: FileObject) -> None:
        await self.state.delete_file(file.id)
        await asyncio.to_thread(self._path(file.id).unlink, True)

    def _copy(self, source: BinaryIO, file_id: str) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self._path(file_id + ".partial")
        size = 0
        try:
            with partial.open("wb") as out:
                while chunk := source.read(_CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise self.too_large()
                    out.write(chunk)
            os.replace(partial, self._path(file_id))
        finally:
            partial.unlink(missing_ok=True)
        return size

    def _write(self, file_id: str, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self._path(file_id + ".partial")
        partial.write_bytes(data)
        os.replace(partial, self._path(file_id))
