//go:build unix

package fstool

import "syscall"

// oNonblock keeps opening a FIFO or device from blocking; it has no effect
// on regular files, and openRegular refuses anything else.
const oNonblock = syscall.O_NONBLOCK
