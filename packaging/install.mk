# packaging/install.mk: install targets.  The top-level Makefile includes it:
#     include $(TOP)/packaging/install.mk
# and uses TOP, KDIR and VENV from there.  Building for KDIR here goes straight to kbuild (no
# `make setup`): a production host needs only the headers of its kernel.
#
#   sudo make install KDIR=/lib/modules/$(uname -r)/build   module + units + config examples
#   sudo make uninstall                                      units stopped, files removed
#   sudo make dkms-install [DKMS_KERNELS="6.1.0-57-amd64"]   DKMS instead of `make install`
#   sudo make dkms-uninstall
# PREFIX (/usr/local) and DESTDIR pass through to packaging/install.sh; AZSWAP_SIGN_KEY and
# AZSWAP_SIGN_CERT sign the installed module (docs/install.md, Secure Boot).

# Including this file never changes the default goal (plain `make` does not install).
az_saved_goal := $(.DEFAULT_GOAL)

.PHONY: install install-module install-files uninstall dkms-install dkms-uninstall

AZ_INSTALL = KO=$(TOP)/kmod/azswap.ko KDIR=$(KDIR) AZCTL=$(VENV)/bin/azctl \
	$(TOP)/packaging/install.sh

install: install-module install-files

install-module:
	$(MAKE) -C $(KDIR) M=$(TOP) modules
	$(AZ_INSTALL) module

install-files:
	$(AZ_INSTALL) files

uninstall:
	$(AZ_INSTALL) uninstall

dkms-install:
	$(TOP)/packaging/dkms-install.sh $(addprefix -k ,$(DKMS_KERNELS))

dkms-uninstall:
	$(TOP)/packaging/dkms-install.sh --uninstall

.DEFAULT_GOAL := $(az_saved_goal)
