package httpapi

// The approval rule (self-approval refused, approval:decide required) and
// its audit event live in package gate: see gate.DecideApproval.
