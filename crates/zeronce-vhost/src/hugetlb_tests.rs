//! Guest RAM on 2 MiB huge pages over vhost-user: a file on a hugetlbfs mount
//! (`ZERONCE_HUGETLBFS_2M`, as QEMU's `memory-backend-file,mem-path=/dev/hugepages`) and
//! an `MFD_HUGETLB` memfd (`memory-backend-memfd,hugetlb=on`). The region is learnt as
//! hugetlb with its page size; a reported 2 MiB block goes back to the pool (its
//! `free_hugepages` rises by one) and reads zero; a 4 KiB report inside a huge page is
//! refused and counted, and the huge page stays.

use std::fs::File;

use serde_json::json;
use zeronce_balloon::DiscardPolicy;
use zeronce_mem::HugetlbPoolCounters;

use crate::backing_tests::{options, status, Guest, BLOCK, SIZE};
use crate::protocol_tests::Daemon;

const HUGE: usize = 2 << 20;

/// Free 2 MiB huge pages, failing with what is missing when fewer than `need` are.
fn free_huge_pages(need: u64) -> u64 {
    let pool = HugetlbPoolCounters::read(HUGE);
    match pool {
        Ok(p) if p.available() >= need => p.free,
        other => panic!(
            "needs {need} free 2 MiB huge pages (echo 64 > /proc/sys/vm/nr_hugepages): {other:?}"
        ),
    }
}

/// A file of guest RAM on the hugetlbfs mount in `ZERONCE_HUGETLBFS_2M`.
fn hugetlbfs_file(name: &str) -> File {
    let dir = std::env::var_os("ZERONCE_HUGETLBFS_2M").unwrap_or_else(|| {
        panic!(
            "needs a hugetlbfs mount of 2 MiB pages in ZERONCE_HUGETLBFS_2M \
             (mount -t hugetlbfs -o pagesize=2M none DIR)"
        )
    });
    let path = std::path::Path::new(&dir).join(format!("vhost-{name}-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // The open file keeps the pages; the name goes at once.
    std::fs::remove_file(&path).unwrap();
    file.set_len(SIZE).unwrap();
    file
}

fn hugetlb_memfd() -> File {
    let flags = rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::HUGETLB;
    let fd = rustix::fs::memfd_create("guest-huge", flags).unwrap();
    rustix::fs::ftruncate(&fd, SIZE).unwrap();
    File::from(fd)
}

/// The scenario on guest RAM in `file` (two 2 MiB huge pages).
fn huge_pages_go_back_to_the_pool(name: &str, file: File) {
    free_huge_pages(2);
    let d = Daemon::start_with(name, false, options(DiscardPolicy::Immediate));
    let mut g = Guest::connect(&d, file);
    let st = status(&d);
    assert_eq!(
        st["regions"],
        json!([{"gpa": 0, "size": SIZE, "backing": "hugetlb", "page_size": HUGE}]),
        "{st}"
    );
    g.fill_block(0x5a);
    let before = free_huge_pages(0);

    // 4 KiB of a huge page: not discardable alone, refused and counted.
    let head = g.report(BLOCK, 4096);
    assert_eq!(g.wait_used("the 4 KiB report"), vec![(head, 0)]);
    assert_eq!(free_huge_pages(0), before, "the huge page stays");
    assert_eq!(g.allocated(), SIZE, "both huge pages still in the file");
    assert_eq!(status(&d)["metrics"]["malformed"], 1);

    let (allocated, before) = (g.allocated(), free_huge_pages(0));
    let head = g.report(BLOCK, BLOCK as u32);
    assert_eq!(g.wait_used("the report"), vec![(head, BLOCK as u32)]);
    let after = free_huge_pages(0);
    eprintln!(
        "{name}: file {allocated} -> {} bytes, free 2 MiB huge pages {before} -> {after}",
        g.allocated()
    );
    assert_eq!(
        allocated - g.allocated(),
        BLOCK,
        "the file lost the huge page"
    );
    // The pool is the whole machine's: another test taking a huge page in these few
    // milliseconds would show here (the file's count above is this test's alone).
    assert_eq!(
        after,
        before + 1,
        "the block's huge page went back to the pool"
    );
    assert!(g.block_reads_zero());
    assert_eq!(status(&d)["metrics"]["zero_promises"], 1);
}

#[test]
#[ignore = "needs 2 MiB huge pages reserved and a hugetlbfs mount; .ci/run provides them"]
fn hugetlbfs_file_report_frees_a_huge_page() {
    huge_pages_go_back_to_the_pool("hugetlbfs", hugetlbfs_file("report"));
}

#[test]
#[ignore = "needs 2 MiB huge pages reserved; .ci/run reserves them"]
fn hugetlb_memfd_report_frees_a_huge_page() {
    huge_pages_go_back_to_the_pool("hugetlb-memfd", hugetlb_memfd());
}
