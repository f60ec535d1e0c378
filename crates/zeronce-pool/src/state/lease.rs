//! Leases: a held file tied to its client's connection, orphaned when the connection
//! closes without a return, reclaimed as dirty work once no process uses it (the effect
//! layer looks; see `crate::usage`).

use super::{FileId, FileState, Job, PoolState, StateError};

impl PoolState {
    /// Ties a held file to its client's connection.
    pub fn lease(&mut self, file: FileId) -> Result<(), StateError> {
        self.transition(file, FileState::Held, FileState::Leased)
    }

    /// The lease's connection closed: a file still leased becomes orphaned (`true`); one
    /// already returned is left alone (`false`).
    pub fn end_lease(&mut self, file: FileId) -> bool {
        let orphaned = self
            .transition(file, FileState::Leased, FileState::Orphaned)
            .is_ok();
        self.counters.leases_orphaned += u64::from(orphaned);
        orphaned
    }

    /// Orphaned files, to check for users.
    pub fn orphans(&self) -> Vec<FileId> {
        (0..self.files.len())
            .map(FileId)
            .filter(|&f| self.files[f.0].state == FileState::Orphaned)
            .collect()
    }

    /// No process has an orphaned file open or mapped: it becomes dirty work, as if
    /// returned.
    pub fn reclaim(&mut self, file: FileId) -> Result<(), StateError> {
        let dirty = self.unchecked(true);
        self.transition(file, FileState::Orphaned, dirty)?;
        self.work.push_back(file);
        self.counters.orphans_reclaimed += 1;
        Ok(())
    }

    /// A free file with work that another process still has open or mapped (found at
    /// start: its record was lost, or it is used without having been taken): held as
    /// orphaned, never zeroed nor handed out, until [`PoolState::reclaim`].
    pub fn hold_until_unused(&mut self, file: FileId) -> Result<(), StateError> {
        if !matches!(self.files[file.0].state, FileState::Dirty { .. }) {
            return Err(StateError::NotInState(file, "dirty"));
        }
        self.work.retain(|&f| f != file);
        self.set(file, FileState::Orphaned);
        Ok(())
    }

    /// A job found its file open elsewhere (someone opened it before the job's first page
    /// or between two): the job ends and the file is held as orphaned, never zeroed nor
    /// handed out, until [`PoolState::reclaim`] finds it unused (all its pages dirty
    /// again). An inline taker gets nothing from it.
    pub fn job_in_use(&mut self, job: Job) -> Result<&FileState, StateError> {
        self.zeroing_pages(&job)?;
        self.counters.jobs_found_in_use += 1;
        self.set(job.file, FileState::Orphaned);
        Ok(&self.files[job.file.0].state)
    }

    fn transition(
        &mut self,
        file: FileId,
        from: FileState,
        to: FileState,
    ) -> Result<(), StateError> {
        let name = match from {
            FileState::Held => "held",
            FileState::Leased => "leased",
            _ => "orphaned",
        };
        if self.files.get(file.0).map(|f| &f.state) != Some(&from) {
            return Err(StateError::NotInState(file, name));
        }
        self.set(file, to);
        Ok(())
    }
}
