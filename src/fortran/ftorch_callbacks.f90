!> How user procedures reach the C layer (hooks, custom functions’ backward, saved-tensor hooks,
!> checkpoint segments, gradcheck). Fortran 2008 lets `c_funloc` take only interoperable
!> procedures, and users write ordinary module procedures, so a procedure travels boxed: each
!> callback kind extends `callback_box` with a procedure pointer of its interface, and
!> `callback_data` returns a C address for the box that the C layer hands back to the kind’s
!> `bind(c)` trampoline, which recovers it with `callback_box_at`.
!>
!> Boxes are registered once per distinct procedure and never freed: the C layer may call a
!> procedure long after the registering call returned (a hook runs at every backward, an unpack
!> hook after its scope ended, a checkpoint segment when backward recomputes it), and the
!> registry stays as small as the set of procedures the program passes, however many times it
!> registers them. Registration holds a process-wide lock (threads may register concurrently);
!> calls from C read only their own box, which never moves.
module ftorch_callbacks
  use, intrinsic :: iso_c_binding, only: c_intptr_t, c_ptr
  implicit none
  private

  public :: callback_box, callback_data, callback_box_at, ftorch_callbacks_registered

  !> A user procedure of one callback interface (extended once per interface).
  type, abstract :: callback_box
  contains
    !> Whether `other` boxes the same procedure (same extension, same procedure).
    procedure(same_interface), deferred :: same
  end type callback_box

  abstract interface
    logical function same_interface(box, other)
      import :: callback_box
      !> This box.
      class(callback_box), intent(in) :: box
      !> Another box, of any extension.
      class(callback_box), intent(in) :: other
    end function same_interface
  end interface

  ! The registry: boxes by number (1, 2, ...), in chunks that are allocated once and never move,
  ! so a callback reads its box without the lock. The C address of a box is its number: no
  ! pointer to a Fortran object crosses to C (c_loc and c_f_pointer of a non-interoperable type
  ! are a portability concern).
  integer, parameter :: CHUNK = 1024, MAX_CHUNKS = 1024
  type :: callback_entry
    class(callback_box), allocatable :: box
  end type callback_entry
  type :: callback_chunk
    type(callback_entry), allocatable :: entries(:)
  end type callback_chunk
  type(callback_chunk), save, target :: chunks(MAX_CHUNKS)
  integer, save :: registered = 0

  interface
    subroutine ftc_callback_registry_lock() bind(c, name="ftc_callback_registry_lock")
    end subroutine ftc_callback_registry_lock
    subroutine ftc_callback_registry_unlock() bind(c, name="ftc_callback_registry_unlock")
    end subroutine ftc_callback_registry_unlock
  end interface

contains

  !> The C address under which the C layer refers to `box`’s procedure (the same address each
  !> time the same procedure is registered).
  function callback_data(box) result(data)
    !> A box holding the procedure (copied into the registry when new).
    class(callback_box), intent(in) :: box
    type(c_ptr) :: data
    type(callback_entry), pointer :: entry
    integer :: i, found
    call ftc_callback_registry_lock()
    found = 0
    do i = 1, registered
      entry => entry_at(i)
      if (entry%box%same(box)) then
        found = i
        exit
      end if
    end do
    if (found == 0 .and. registered < CHUNK * MAX_CHUNKS) then
      found = registered + 1
      if (.not. allocated(chunks((found - 1) / CHUNK + 1)%entries)) then
        allocate(chunks((found - 1) / CHUNK + 1)%entries(CHUNK))
      end if
      entry => entry_at(found)
      allocate(entry%box, source=box)
      registered = found
    end if
    call ftc_callback_registry_unlock()
    ! 0 (a null address, which the C layer refuses) only once a million procedures are registered.
    data = transfer(int(found, c_intptr_t), data)
  end function callback_data

  !> The box registered under `data` (an address `callback_data` returned).
  function callback_box_at(data) result(box)
    !> The address the C layer was given.
    type(c_ptr), intent(in) :: data
    class(callback_box), pointer :: box
    type(callback_entry), pointer :: entry
    entry => entry_at(int(transfer(data, 0_c_intptr_t)))
    box => entry%box
  end function callback_box_at

  ! Entry number i of the registry (its chunk allocated).
  function entry_at(i) result(entry)
    integer, intent(in) :: i
    type(callback_entry), pointer :: entry
    entry => chunks((i - 1) / CHUNK + 1)%entries(mod(i - 1, CHUNK) + 1)
  end function entry_at

  !> Number of distinct procedures registered so far (all kinds): stays flat when a program
  !> registers the same procedures again and again.
  integer function ftorch_callbacks_registered()
    call ftc_callback_registry_lock()
    ftorch_callbacks_registered = registered
    call ftc_callback_registry_unlock()
  end function ftorch_callbacks_registered

end module ftorch_callbacks
