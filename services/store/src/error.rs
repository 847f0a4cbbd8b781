//! The store's error type. Every variant is written to be shown to a client: no paths, no io
//! text. Details for operators go to the log where the error is created.

/// Why a tenant operation failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The request itself is wrong (maps to INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request is well-formed but the cell's state forbids it (FAILED_PRECONDITION).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A bound was hit; retry later (RESOURCE_EXHAUSTED).
    #[error("{0}")]
    ResourceExhausted(String),
    /// The tenant cannot serve now: poisoned or unopenable storage, shutting down; may pass by
    /// itself or after a restart (UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
    /// No such tenant, key, or cell where one is required (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// Already exists (ALREADY_EXISTS).
    #[error("{0}")]
    AlreadyExists(String),
    /// The caller's key was revoked after its call was authenticated (UNAUTHENTICATED).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's key lost the capability its call needs after the call was authenticated
    /// (PERMISSION_DENIED).
    #[error("{0}")]
    PermissionDenied(String),
    /// Stored data is damaged or gone, and only an operator can help: audit entries missing
    /// from the trail (neither expired by retention nor ever allowed to go), a stored value
    /// that does not decode, a corrupt log, a record that cannot be applied, state older than
    /// the log (DATA_LOSS).
    #[error("{0}")]
    DataLoss(String),
}

impl StoreError {
    /// This error for a caller whose change was already appended to the tenant's log when the
    /// tenant failed: the change may still take effect (a failed apply is replayed at the
    /// reopen; a record the failed fdatasync or write did reach the disk is recovered), so the
    /// caller is told its outcome is unknown rather than invited to retry blindly.
    pub fn outcome_unknown(&self) -> StoreError {
        const UNKNOWN: &str = " This change was already in the tenant's log, so its outcome is \
                               unknown: it may still take effect when the tenant reopens; read \
                               before retrying a change that is not idempotent.";
        match self {
            StoreError::ResourceExhausted(m) => {
                StoreError::ResourceExhausted(format!("{m}{UNKNOWN}"))
            }
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("{m}{UNKNOWN}")),
            StoreError::DataLoss(m) => StoreError::DataLoss(format!(
                "{m} This change was already in the tenant's log, so its outcome is unknown: \
                 whether it takes effect depends on the repair; read it back once the tenant \
                 serves again."
            )),
            other => other.clone(),
        }
    }
}

/// Where an operator's change goes when the tenant's log refuses it. Both rules are exercised end
/// to end by cubed's `a_tenant_with_a_corrupt_log_can_still_have_keys_revoked_and_its_durability_set`.
impl StoreError {
    /// Whether an operator's key revocation that the tenant's log refused with this error is
    /// made through the catalog instead (without its audit entry): a revocation must not depend
    /// on the tenant's log being healthy. Only an unknown key is the answer as it is.
    pub fn revocation_goes_to_catalog(&self) -> bool {
        !matches!(self, StoreError::NotFound(_))
    }

    /// Whether an operator's durability change that the tenant's log refused with this error is
    /// set through the catalog instead, for the tenant's next open (without its audit entry):
    /// only for a tenant whose log cannot be opened or written (UNAVAILABLE, or DATA_LOSS for a
    /// corrupt one). Any other refusal (a full disk, say) is the answer.
    pub fn durability_goes_to_catalog(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::DataLoss(_))
    }
}

/// Client text quoted back in a refusal, cut to 128 bytes: a header or a request field can be far
/// longer than some clients take in an answer's metadata.
pub fn clipped(text: &str) -> std::borrow::Cow<'_, str> {
    const MAX: usize = 128;
    let mut end = text.len().min(MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let (head, cut) = (&text[..end], end < text.len());
    // Control characters escaped: a line break quoted into an audit entry's detail would make
    // the entry read (and, in the chain's line-based canonical string, hash) like other fields.
    let control = head.chars().any(char::is_control);
    if !cut && !control {
        return head.into();
    }
    let mut out: String = if control {
        head.escape_debug().collect()
    } else {
        head.to_string()
    };
    if cut {
        out.push('…');
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::clipped;

    #[test]
    fn client_text_quoted_in_a_refusal_is_clipped_at_a_character_boundary() {
        assert_eq!(clipped("k1"), "k1");
        let long = "k".repeat(127) + "é" + &"x".repeat(10_000);
        let cut = clipped(&long);
        assert_eq!(cut, "k".repeat(127) + "…");
        assert_eq!(clipped(&"k".repeat(128)), "k".repeat(128));
        // Control characters are escaped: quoted into an audit entry, a line break would read
        // like the start of another field.
        assert_eq!(clipped("x\ny"), "x\\ny");
        assert_eq!(clipped(&("\n".repeat(200))), "\\n".repeat(128) + "…");
    }
}
