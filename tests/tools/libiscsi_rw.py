#!/usr/bin/env python3
"""Writes a pattern through libiscsi and reads it back: a libiscsi program that needs
nothing beyond the libiscsi7 library (installed with libiscsi-bin), for tests that
must not depend on qemu's optional iSCSI module.

usage: libiscsi_rw.py ISCSI_URL LBA BLOCKS SEED [--read-only-check]
Prints "ok" and exits 0 when the data read back is the data written; with
--read-only-check, expects the write to be refused with DATA PROTECT and prints
"refused".
"""
import ctypes
import sys

GOOD = 0
CHECK_CONDITION = 2
ISCSI_SESSION_NORMAL = 2
DATA_PROTECT = 7


class IscsiData(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("data", ctypes.c_void_p)]


class IscsiUrl(ctypes.Structure):
    # The leading fields of struct iscsi_url (libiscsi's iscsi.h): 256-byte strings.
    _fields_ = [
        ("portal", ctypes.c_char * 256),
        ("target", ctypes.c_char * 256),
        ("user", ctypes.c_char * 256),
        ("passwd", ctypes.c_char * 256),
        ("target_user", ctypes.c_char * 256),
        ("target_passwd", ctypes.c_char * 256),
        ("lun", ctypes.c_int),
    ]


def load():
    lib = ctypes.CDLL("libiscsi.so.7")
    lib.iscsi_create_context.restype = ctypes.c_void_p
    lib.iscsi_create_context.argtypes = [ctypes.c_char_p]
    lib.iscsi_parse_full_url.restype = ctypes.POINTER(IscsiUrl)
    lib.iscsi_parse_full_url.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.iscsi_set_targetname.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.iscsi_set_session_type.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.iscsi_full_connect_sync.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.iscsi_get_error.restype = ctypes.c_char_p
    lib.iscsi_get_error.argtypes = [ctypes.c_void_p]
    lib.scsi_cdb_write16.restype = ctypes.c_void_p
    lib.scsi_cdb_write16.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int] + [ctypes.c_int] * 5
    lib.scsi_cdb_read16.restype = ctypes.c_void_p
    lib.scsi_cdb_read16.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int] + [ctypes.c_int] * 5
    lib.scsi_task_add_data_in_buffer.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.iscsi_scsi_command_sync.restype = ctypes.c_void_p
    lib.iscsi_scsi_command_sync.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(IscsiData)]
    lib.scsi_free_scsi_task.argtypes = [ctypes.c_void_p]
    lib.iscsi_logout_sync.argtypes = [ctypes.c_void_p]
    lib.iscsi_destroy_context.argtypes = [ctypes.c_void_p]
    return lib


def status_of(task):
    # struct scsi_task starts with `int status`.
    return ctypes.cast(task, ctypes.POINTER(ctypes.c_int))[0]


def sense_key_of(task):
    # struct scsi_task: status, cdb_size, xfer_dir, expxferlen (4 ints), cdb[16], the
    # residual status (an enum, padded so that) the residual (a size_t) is aligned,
    # then struct scsi_sense: the error type (a byte, padded) and the key (an enum).
    base = ctypes.cast(task, ctypes.c_void_p).value
    sense = 4 * 4 + 16 + 8 + 8
    return ctypes.c_int.from_address(base + sense + 4).value


def main():
    args = sys.argv[1:]
    check_read_only = "--read-only-check" in args
    args = [a for a in args if a != "--read-only-check"]
    url, lba, blocks, seed = args[0], int(args[1]), int(args[2]), int(args[3])
    lib = load()
    ctx = lib.iscsi_create_context(b"iqn.2026-11.dev.blockwire:libiscsi-rw")
    parsed = lib.iscsi_parse_full_url(ctx, url.encode())
    if not parsed:
        sys.exit("bad URL: " + lib.iscsi_get_error(ctx).decode())
    lib.iscsi_set_targetname(ctx, parsed.contents.target)
    lib.iscsi_set_session_type(ctx, ISCSI_SESSION_NORMAL)
    if lib.iscsi_full_connect_sync(ctx, parsed.contents.portal, parsed.contents.lun) != 0:
        sys.exit("login failed: " + lib.iscsi_get_error(ctx).decode())
    lun = parsed.contents.lun
    block_size = 512
    length = blocks * block_size
    pattern = bytes((seed + i * 7 + i // 512) & 0xFF for i in range(length))
    out = ctypes.create_string_buffer(pattern, length)
    task = lib.scsi_cdb_write16(lba, length, block_size, 0, 0, 0, 0, 0)
    data = IscsiData(length, ctypes.cast(out, ctypes.c_void_p))
    task = lib.iscsi_scsi_command_sync(ctx, lun, task, ctypes.byref(data))
    if not task:
        sys.exit("write failed: " + lib.iscsi_get_error(ctx).decode())
    status = status_of(task)
    if check_read_only:
        if status == CHECK_CONDITION and sense_key_of(task) == DATA_PROTECT:
            print("refused")
            return
        sys.exit(f"write to a read-only LUN: status {status}, not DATA PROTECT")
    if status != GOOD:
        sys.exit(f"write: status {status}")
    lib.scsi_free_scsi_task(task)
    back = ctypes.create_string_buffer(length)
    task = lib.scsi_cdb_read16(lba, length, block_size, 0, 0, 0, 0, 0)
    lib.scsi_task_add_data_in_buffer(task, length, ctypes.cast(back, ctypes.c_void_p))
    task = lib.iscsi_scsi_command_sync(ctx, lun, task, None)
    if not task or status_of(task) != GOOD:
        sys.exit("read failed: " + lib.iscsi_get_error(ctx).decode())
    lib.scsi_free_scsi_task(task)
    lib.iscsi_logout_sync(ctx)
    lib.iscsi_destroy_context(ctx)
    if back.raw != pattern:
        first = next(i for i in range(length) if back.raw[i] != pattern[i])
        sys.exit(f"read back differs from what was written, first at byte {first}")
    print("ok")


if __name__ == "__main__":
    main()
